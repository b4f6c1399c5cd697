"""HTTP plumbing shared by the leader, the worker and the simulator.

- :mod:`~opod.http.serving`: listeners on uvicorn (uvloop, httptools), bound before they serve.
- :mod:`~opod.http.fastpath`: the hot routes' short way through uvicorn's protocol, below Starlette.
- :mod:`~opod.http.upstream`: the keep-alive HTTP/1.1 pool that relays and node calls use.
- :mod:`~opod.http.inbound`: a client request's id and its body under a cap.
- :mod:`~opod.http.errors`: typed refusals shared by the listeners, and OpenAI's error body.
- :mod:`~opod.http.fastjson`: JSON on the hot path (orjson).
- :mod:`~opod.http.tls`: the leader's HTTPS listener and worker certificates.

Nothing is imported here, so each module pulls in only what it needs.
"""
