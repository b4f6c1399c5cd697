"""TLS for opod: the leader's HTTPS public listener, and workers identified by client certificates.

- :mod:`opod.http.tls.server`: :class:`~opod.http.tls.server.LeaderTLS`, the listener's context, rebuilt
  when the auth file's ``nodeCertCa`` changes; the leader builds it when ``OPOD_TLS_CERT`` is set.
- :mod:`opod.http.tls.peer`: what the handshake proved about the peer, carried in the ASGI scope.
- :mod:`opod.http.tls.protocol`: the uvicorn protocol that puts it there.
- :mod:`opod.http.tls.identity`: the node a certificate names, judged against the auth file's policy.
- :mod:`opod.http.tls.client`: a worker's context for a TLS leader (``OPOD_LEADER_CA``, its own certificate).

Nothing is imported here, so :mod:`opod.http.serving` can use the protocol without pulling in the rest.
"""
