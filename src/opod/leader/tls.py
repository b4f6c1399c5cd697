"""The leader's HTTPS public listener, connected to the auth file and the join handlers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from opod.http.tls.server import LeaderTLS

if TYPE_CHECKING:
    from opod.leader.leader import Leader


async def enable_leader_tls(leader: Leader, certfile: str | Path, keyfile: str | Path) -> LeaderTLS:
    """Serve ``leader``'s public listener over HTTPS and let workers authenticate with certificates.

    Call after ``leader.start_snapshots()`` and before binding the public listener; then
    pass ``.context`` as the public :class:`~opod.http.serving.Listener`'s ``ssl``. It tells the
    auth file that worker certificates are now verified (so ``nodeMtls: require`` is
    accepted, and a ``require`` file refused before is judged again) and gives the
    register and heartbeat handlers the auth file's policy.
    """
    if leader.snapshots is None or leader.registry is None:
        raise RuntimeError("enable_leader_tls needs a started leader: call leader.start_snapshots() first")
    auth = leader.snapshots.auth
    tls = LeaderTLS(certfile, keyfile, lambda: auth.node_mtls)
    await leader.snapshots.verify_client_certs()
    leader.registry.node_mtls = lambda: auth.node_mtls
    return tls
