"""The worker → leader half of the node protocol: register and heartbeat.

Both calls are signed (``X-Opod-Auth``, no bearer fallback) and replay-checked.
On a TLS listener the auth file's ``nodeMtls`` adds a second credential: a
worker's client certificate naming the node (:mod:`opod.http.tls.identity`). In
``allow`` a certificate authenticates the call and a signature, if also sent,
must verify too (it binds the token the leader signs its own calls to the
worker with); without a certificate the token decides. In ``require`` a call
without a certificate is refused, save from ``opod up``'s own worker: on
loopback, signed with the local token that only the leader holds. ``off``
ignores certificates.
Register records the node in memory and in the store; a heartbeat updates the
fleet in memory and, at most every ``TOUCH_EVERY`` seconds, the node's last-seen
time in the store. A heartbeat from an unknown node is answered 404, which tells
the worker to register again.

The node's inventory (``NodeState.inventory``) is the worker's word (opod's
``OpodInventory`` in its capabilities, or the contract's whole cards) with the
operator's side kept across re-registrations: cordon, operator labels, engine
builds and the wanted release come from the store, never from the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.access.nodetokens import LOCAL_TOKEN_ID
from opod.access.service import AccessService
from opod.contract import nodeapi
from opod.contract.nodeauth import HEADER, AuthRefused, Refusal, SignedHeader
from opod.contract.wire import WireError
from opod.fleet.followers import EventSink
from opod.fleet.inventory import OperatorSide, apply_report
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet, NodeState
from opod.http.tls.identity import CertRefused, certificate_identity, certificates_checked, required_refusal
from opod.http.tls.peer import connection_of
from opod.http.tls.policy import NodeMtls
from opod.leader.adminv1.context import admin_error_response
from opod.store import NodeRecord, Store
from opod.store.offloop import run_sync

log = logging.getLogger("opod.leader")

W = TypeVar("W", bound=nodeapi.WireModel)
P = ParamSpec("P")

BODY_CAP = 4 << 20
TOUCH_EVERY = 30.0
TOUCH_BATCH = 1.0
"""Seconds last-seen times wait to be written together: a large fleet makes one write a second, not one a node."""


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def refusal_response(err: AuthRefused) -> Response:
    status = 403 if err.reason in (Refusal.UNKNOWN_NODE, Refusal.REPLAYED) else 401
    return admin_error_response(status, str(err), "unauthorized" if status == 401 else "forbidden")


def cert_refusal_response(err: CertRefused) -> Response:
    response = admin_error_response(err.status, str(err), err.kind)
    if err.status == 421:
        # Make the client drop this connection, so its retry gets a fresh handshake.
        response.headers["Connection"] = "close"
    return response


def restored(node: NodeState, record: NodeRecord) -> NodeState:
    """A node read from the store at start-up: its reported inventory as last registered, and the operator's side."""
    apply_report(node.inventory, node.hardware.inventory, node.hardware.gpus)
    node.cordoned = record.cordoned and not record.drained
    node.inventory.operator_labels = record.operator_labels
    node.inventory.operator = OperatorSide(engine_builds=record.engine_builds, wanted_version=record.wanted_version)
    node.inventory.last_seen = record.last_seen_at.timestamp()
    return node


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


@dataclass(frozen=True, slots=True)
class _Caller:
    """Who a register or heartbeat comes from, and by which credentials."""

    node_id: str
    header: SignedHeader | None
    """The verified signature, when one was sent."""
    token_id: str | None
    """The token that signed it."""
    by_cert: bool

    @property
    def credential(self) -> str:
        return "certificate+token" if self.by_cert and self.header else "certificate" if self.by_cert else "token"


class NodeRegistry:
    """The join paths. ``node_mtls`` is the auth file's worker-certificate policy now
    (``AuthFile.node_mtls``); on a leader without TLS it is never enforced."""

    def __init__(
        self,
        fleet: Fleet,
        access: AccessService,
        store: Store,
        on_change: Callable[[], None],
        emit: EventSink,
        index: PrefixIndex,
        node_mtls: Callable[[], NodeMtls],
    ) -> None:
        self.fleet = fleet
        self.access = access
        self.tokens = access.tokens
        self.store = store
        self._on_change = on_change
        self._emit = emit
        self._index = index
        self.node_mtls = node_mtls
        self._touched: dict[str, float] = {}
        self._to_touch: set[str] = set()
        """Nodes whose last-seen time is due to be written with the next batch."""
        self._silent: set[str] = set()
        self._writes: set[asyncio.Task[None]] = set()
        """Last-seen writes in flight: held so none is collected mid-way, cancelled at :meth:`close`."""

    async def close(self) -> None:
        """Cancel the last-seen writes still in flight (the next start reads heartbeats afresh)."""
        writes, self._writes = list(self._writes), set()  # a list: each task's done callback discards it from the set
        for task in writes:
            task.cancel()
        for task in writes:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _touch_soon(self) -> None:
        await asyncio.sleep(TOUCH_BATCH)
        batch, self._to_touch = sorted(self._to_touch), set()
        await self._store_quietly(
            f"the last-seen time of {len(batch)} nodes", self.store.touch_nodes, batch, datetime.now(UTC)
        )

    async def _store_quietly(self, what: str, call: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs) -> None:
        """Write to the store off the event loop; a failure is logged, never raised into a worker's call.

        The fleet in memory is already right, and the node's next register or heartbeat writes again.
        """
        try:
            await run_sync(call, *args, **kwargs)
        except Exception as err:
            log.warning("storing %s failed: %s", what, err)

    def routes(self) -> list[Route]:
        return [
            Route(nodeapi.PATH_REGISTER, self.register, methods=["POST"]),
            Route(nodeapi.PATH_HEARTBEAT, self.heartbeat, methods=["POST"]),
        ]

    async def _body(self, request: Request, kind: type[W]) -> W:
        data = await request.body()
        if len(data) > BODY_CAP:
            raise WireError(kind.__name__, [f"body is larger than {BODY_CAP >> 20} MiB"])
        return kind.from_wire(data)

    def _authenticate(self, request: Request, *, registering: bool) -> _Caller:
        """The caller's credentials, checked; raises ``AuthRefused`` or ``_Refused``."""
        policy = self.node_mtls()
        try:
            cert_id = certificate_identity(policy, connection_of(request.scope))
        except CertRefused as err:
            log.warning("%s refused: %s", request.url.path.rsplit("/", 1)[-1], err)
            raise _Refused(cert_refusal_response(err)) from None
        value = request.headers.get(HEADER)
        if cert_id is None and policy.mode == "require" and certificates_checked(policy):
            local = self._own_worker(request, value, registering)
            if local is None:
                raise _Refused(admin_error_response(401, required_refusal(), "unauthorized"))
            return local
        if cert_id is not None and value is None:
            return _Caller(cert_id, None, None, by_cert=True)
        # A signature that is sent must verify, certificate or not: it is replay-checked, and it
        # binds the token the leader signs its calls to this worker with.
        header, token_id = self.tokens.check(value, "POST", request.url.path, registering=registering)
        if cert_id is not None and header.node_id != cert_id:
            raise _Refused(
                admin_error_response(
                    403,
                    f"the client certificate names node {cert_id!r} but the signature is node {header.node_id!r}",
                    "forbidden",
                )
            )
        return _Caller(header.node_id, header, token_id, by_cert=cert_id is not None)

    def _own_worker(self, request: Request, value: str | None, registering: bool) -> _Caller | None:
        """``opod up``'s own worker under ``require``: on loopback, signed with the local token only the leader holds.

        It runs in the leader's process and has no certificate to show; anyone else still needs one.
        """
        client = request.client
        if value is None or client is None or not _loopback(client.host):
            return None
        header, token_id = self.tokens.check(value, "POST", request.url.path, registering=registering)
        return _Caller(header.node_id, header, token_id, by_cert=False) if token_id == LOCAL_TOKEN_ID else None

    def _body_names(self, caller: _Caller, body_id: str) -> Response | None:
        if body_id == caller.node_id:
            return None
        what = "the client certificate names" if caller.by_cert else "the signature is"
        return admin_error_response(
            403, f"the body names node {body_id!r} but {what} node {caller.node_id!r}", "forbidden"
        )

    async def register(self, request: Request) -> Response:
        try:
            caller = self._authenticate(request, registering=True)
            req = await self._body(request, nodeapi.RegisterRequest)
            hardware = req.hardware()
        except _Refused as refused:
            return refused.response
        except AuthRefused as err:
            log.warning("register refused: %s", err)
            return refusal_response(err)
        except WireError as err:
            return admin_error_response(400, str(err), "invalid_request")
        mismatch = self._body_names(caller, req.id)
        if mismatch is not None:
            return mismatch
        if not req.address:
            return admin_error_response(
                400, "RegisterRequest: address: required (host:port the leader can dial)", "invalid_request"
            )
        if caller.token_id is not None:
            self.access.bind_node(req.id, caller.token_id)
        # A certificate-only register keeps the token the node joined with before, if any.
        token_id = caller.token_id or self.tokens.token_id_of(req.id)
        before = self.fleet.get(req.id)
        kept = (
            (before.cordoned, before.inventory.operator_labels, before.inventory.operator)
            if before is not None
            else None
        )
        node = self.fleet.register(req, token_id or "", hardware)
        if kept is not None:
            node.cordoned, node.inventory.operator_labels, node.inventory.operator = kept
        apply_report(node.inventory, hardware.inventory, hardware.gpus)
        node.inventory.last_seen = time.time()
        node.same_host = _loopback(request.client.host if request.client else "") and _loopback(
            req.address.rsplit(":", 1)[0]
        )
        event = {
            "address": req.address,
            "engine": hardware.engine,
            "boot_id": req.boot_id,
            "credential": caller.credential,
        }
        if token_id is None:
            event["warning"] = (
                "registered by certificate without a signed header: the leader holds no token to sign its calls to this worker"
            )
        self._emit("node.registered", req.id, event)
        log.info(
            "node %s registered from %s (engine %s, by %s)",
            node.id,
            node.address,
            hardware.engine or "unstated",
            caller.credential,
        )
        now = datetime.now(UTC)
        # The node's row also keeps which token it joined with: the binding outlives a restart.
        await self._store_quietly(
            f"node {req.id}",
            self.store.upsert_node,
            req.id,
            hostname=req.hostname,
            os=req.os,
            arch=req.arch,
            ram_gb=req.ram_gb,
            address=req.address,
            hardware_json=req.hardware_json or "{}",
            boot_id=req.boot_id,
            token_id=token_id,
            at=now,
        )
        self._on_change()
        body = nodeapi.RegisterResponse(status=nodeapi.Status.REGISTERED, id=req.id)
        return Response(body.to_json(), media_type="application/json")

    async def heartbeat(self, request: Request) -> Response:
        try:
            caller = self._authenticate(request, registering=False)
            hb = await self._body(request, nodeapi.Heartbeat)
        except _Refused as refused:
            return refused.response
        except AuthRefused as err:
            if (
                err.reason is Refusal.UNKNOWN_NODE
                and self.fleet.get(err.node_id) is None
                and self.tokens.token_id_of(err.node_id) is None
            ):
                return admin_error_response(404, str(err), "not_found")
            return refusal_response(err)
        except WireError as err:
            return admin_error_response(400, str(err), "invalid_request")
        mismatch = self._body_names(caller, hb.id)
        if mismatch is not None:
            return mismatch
        before = self.fleet.get(hb.id)
        models_before = before.loaded_models if before else None
        node = self.fleet.heartbeat(hb)
        if node is None:
            return admin_error_response(
                404, f"node {hb.id!r} is not registered with this leader; register first", "not_found"
            )
        node.inventory.last_seen = time.time()
        if hb.inventory is not None:
            apply_report(node.inventory, hb.inventory, node.hardware.gpus)
        self._report_changes(node, hb, models_before)
        if hb.kv_blocks is not None and self._index is not None:
            self._index.apply(node.id, node.boot_id, hb.kv_blocks)
        now = time.monotonic()
        if now - self._touched.get(node.id, 0.0) > TOUCH_EVERY:
            self._touched[node.id] = now
            self._to_touch.add(node.id)
            if len(self._to_touch) == 1:  # the first of a batch: write them all a moment from now, in one transaction
                task = asyncio.create_task(self._touch_soon())
                self._writes.add(task)
                task.add_done_callback(self._writes.discard)
        orders = node.inventory.operator
        answer = nodeapi.HeartbeatResponse(
            status=nodeapi.Status.OK,
            wanted_version=orders.wanted_version,
            engine_builds=dict(orders.engine_builds) or None,
        )
        return Response(answer.to_json(), media_type="application/json")

    def _report_changes(self, node: NodeState, hb: nodeapi.Heartbeat, before: frozenset[str] | None) -> None:
        """Events for what this heartbeat changed: models on the node, and the engine going silent or back."""
        if hb.loaded_models is None:
            if node.id not in self._silent:
                self._silent.add(node.id)
                self._emit("node.engine_silent", node.id, {"reason": "the engine did not answer the worker in time"})
            return
        if node.id in self._silent:
            self._silent.discard(node.id)
            self._emit("node.engine_reporting", node.id, {})
        before = before or frozenset()
        for model in sorted(node.loaded_models - before):
            self._emit("model.loaded", model, {"node": node.id})
        for model in sorted(before - node.loaded_models):
            self._emit("model.unloaded", model, {"node": node.id})
        if node.loaded_models != before:
            self._on_change()
