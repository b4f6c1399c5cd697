"""The door: ``opod up --role door``, a small reverse proxy in front of several leaders.

A routes file maps each model name clients ask for to the leader serving it
(:mod:`opod.door.routes`); the proxy (:mod:`opod.door.app`) sends each ``/v1``
request to its leader and the answer back byte for byte; :mod:`opod.door.server`
runs both. The door holds no store, no keys and no fleet.
"""
