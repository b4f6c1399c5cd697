"""Federation: other opod clusters as providers, their models offered here as ``PEER/MODEL``.

A peer is added by the name this cluster gives it, its client address (without ``/v1``) and where the
key it issued to this cluster is (:mod:`opod.fleet.peer_keys`). It is checked before it is kept and
then every :data:`CHECK_EVERY_S`: its ``/readyz``, timed (the network to the other site and its front,
not a model's speed), and its ``/v1/models`` with the key. While a check fails the peer is down and
out of routing; its models stay listed. A model the peer stops offering leaves the list, unless a
fallback here names it: then it is kept, ``withdrawn``, so the fallback is skipped rather than broken.

Each cluster has an id of its own (kept in the store's ``meta``, the same for every leader of a
store). A request sent to a peer carries ``X-Llmgw-Hop``, the ids of the clusters it passed
through; a cluster that finds its own id there refuses the request with 508, so two clusters that
fall back to each other cannot send a request round for ever. With ``send_tags`` the request also
carries ``X-Llmgw-Tags`` naming this cluster and the sending project: off unless asked, since the
peer then learns who here is asking.

:class:`Federation` owns the peers: the store first (with the audit row), then memory. The gateway
asks :meth:`Federation.target` for a peer's model; ``PUT /models/{name}/fallbacks`` asks
:meth:`Federation.names` which peers exist.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

import aiohttp

from opod.fleet.fallbacks import PEER_MARK, fallbacks_of
from opod.fleet.models import ModelRegistry
from opod.fleet.peer_keys import PeerKeyError, key_reference_problem, read_peer_key
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.federation import PeerRecord
from opod.store.offloop import run_sync

log = logging.getLogger("opod.fleet")

HOP_HEADER = "X-Llmgw-Hop"
TAGS_HEADER = "X-Llmgw-Tags"
CLUSTER_HEADER = "X-Llmgw-Cluster"
"""On a leader's ``/readyz`` answer: its cluster's id, which a peer shows as the peer's ``cluster``."""
CLUSTER_META = "cluster_id"
CHECK_EVERY_S = 30.0
CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class PeerModel:
    name: str
    """As this cluster offers it: ``PEER/MODEL``."""
    upstream: str
    """As the peer calls it."""
    withdrawn: bool = False


@dataclass(slots=True)
class Peer:
    """A peer as this leader knows it: what the store keeps, and how its last check went."""

    record: PeerRecord
    up: bool = False
    cluster: str = ""
    checked: datetime | None = None
    latency_ns: int = 0
    error: str = ""
    synced_at: datetime | None = None
    models: dict[str, PeerModel] = field(default_factory=dict)
    key: str = ""
    """The key read at the last check; never shown."""


@dataclass(frozen=True, slots=True)
class PeerTarget:
    """Where a request for a peer's model goes."""

    peer: str
    base_url: str
    """The peer's OpenAI-compatible base, ``URL/v1``."""
    key: str
    upstream: str
    send_tags: bool


@dataclass(frozen=True, slots=True)
class CheckResult:
    up: bool
    cluster: str
    latency_ns: int
    error: str
    models: list[str]
    key: str


class Federation:
    """The peers of this cluster: kept, checked, and asked where a ``PEER/MODEL`` request goes."""

    def __init__(self, store: Store, models: ModelRegistry, cluster: str) -> None:
        self.store = store
        self.models = models
        self.cluster = cluster
        self._http: aiohttp.ClientSession | None = None
        """Made on the first check, on the leader's loop."""
        self._peers: dict[str, Peer] = {}

    @classmethod
    def load(cls, store: Store, models: ModelRegistry, cluster: str) -> Federation:
        federation = cls(store, models, cluster)
        for record in store.federation_peers():
            federation._peers[record.name] = Peer(record)
        return federation

    # --- reading ---------------------------------------------------------------------------------

    def peers(self) -> list[Peer]:
        return [self._peers[name] for name in sorted(self._peers)]

    def names(self) -> list[str]:
        return sorted(self._peers)

    def named(self, name: str) -> Peer:
        peer = self._peers.get(name)
        if peer is None:
            raise NotFound(f"no federation peer is named {name!r}; GET /api/v1/federation lists them")
        return peer

    def target(self, model: str) -> PeerTarget | None:
        """Where ``PEER/MODEL`` goes now; ``None`` when the peer is unknown, down, or does not offer it."""
        name, _, _ = model.partition(PEER_MARK)
        peer = self._peers.get(name)
        if peer is None or not peer.up:
            return None
        offered = peer.models.get(model)
        if offered is None or offered.withdrawn:
            return None
        record = peer.record
        return PeerTarget(name, record.url + "/v1", peer.key, offered.upstream, record.send_tags)

    def offered(self) -> list[str]:
        """Every peer's model a request may name now (the peer up, the model not withdrawn), sorted."""
        return sorted(m.name for p in self._peers.values() if p.up for m in p.models.values() if not m.withdrawn)

    def knows(self, model: str) -> bool:
        """Whether ``model`` is a peer's model this cluster lists (up or down, withdrawn or not)."""
        peer = self._peers.get(model.partition(PEER_MARK)[0])
        return peer is not None and model in peer.models

    # --- changing --------------------------------------------------------------------------------

    async def add(self, name: str, url: str, key_file: str, send_tags: bool, audit: AuditDraft) -> Peer:
        """Add the peer, or change the one of that name, once a check of it succeeds; nothing kept otherwise."""
        problems = _add_problems(name, url, key_file)
        if problems:
            raise InvalidInput("; ".join(problems))
        url = url.rstrip("/")
        result = await self._check(url, key_file)
        if not result.up:
            raise InvalidInput(f"url: the peer at {url} was checked and is not usable: {result.error}; nothing kept")
        if result.cluster and result.cluster == self.cluster:
            raise InvalidInput(f"url: {url} is this cluster itself (cluster {self.cluster}); name another cluster")
        now = datetime.now(UTC)
        with audit.commit(target=f"peer:{name}") as row:
            record = await run_sync(
                self.store.put_federation_peer,
                PeerRecord(name, url, key_file, send_tags, now, audit.actor),
                audit=row,
            )
        peer = self._peers.get(name) or Peer(record)
        peer.record = record
        self._apply(peer, result, now)
        self._peers[name] = peer
        return peer

    async def remove(self, name: str, audit: AuditDraft) -> Peer:
        """Remove the peer and its models; ``Conflict`` while a model here falls back to one of them."""
        peer = self.named(name)
        users = sorted(
            f"{model.id} (→ {target})"
            for model in self.models
            if not model.removed
            for target in fallbacks_of(model)
            if target.partition(PEER_MARK)[0] == name and PEER_MARK in target
        )
        if users:
            raise Conflict(
                f"models here fall back to the peer {name!r}: {', '.join(users)}; change their fallbacks "
                "(PUT /api/v1/models/{name}/fallbacks) first"
            )
        with audit.commit(target=f"peer:{name}") as row:
            await run_sync(self.store.remove_federation_peer, name, audit=row)
        return self._peers.pop(name, peer)

    async def sync(self, name: str) -> Peer:
        """Check the peer now, rather than at the next interval."""
        peer = self.named(name)
        record = peer.record
        self._apply(peer, await self._check(record.url, record.key_file), datetime.now(UTC))
        return peer

    async def check_all(self) -> None:
        peers = list(self._peers.values())
        results = await asyncio.gather(*(self._check(p.record.url, p.record.key_file) for p in peers))
        now = datetime.now(UTC)
        for peer, result in zip(peers, results, strict=True):
            if self._peers.get(peer.record.name) is peer:
                self._apply(peer, result, now)

    async def run(self, stop: asyncio.Event) -> None:
        """Check every peer every :data:`CHECK_EVERY_S`, until ``stop``; then close the connections."""
        try:
            while not stop.is_set():
                try:
                    await self.check_all()
                except Exception:  # one bad round must not end the loop
                    log.exception("checking the federation peers failed")
                try:
                    await asyncio.wait_for(stop.wait(), CHECK_EVERY_S)
                except TimeoutError:
                    pass
        finally:
            if self._http is not None:
                await self._http.close()
                self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        return self._http

    # --- checking --------------------------------------------------------------------------------

    async def _check(self, url: str, key_file: str) -> CheckResult:
        try:
            key = await read_peer_key(key_file, self._session())
        except PeerKeyError as err:
            return CheckResult(False, "", 0, f"its key: {err}", [], "")
        timeout = aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)
        started = time.perf_counter_ns()
        try:
            async with self._session().get(url + "/readyz", timeout=timeout) as ready:
                await ready.read()
                latency = time.perf_counter_ns() - started
                cluster = ready.headers.get(CLUSTER_HEADER, "")
                if ready.status != 200:
                    return CheckResult(False, cluster, latency, f"/readyz answered HTTP {ready.status}", [], key)
            headers = {"Authorization": f"Bearer {key}"}
            async with self._session().get(url + "/v1/models", headers=headers, timeout=timeout) as listed:
                if listed.status != 200:
                    said = (await listed.text())[:200]
                    return CheckResult(
                        False, cluster, latency, f"/v1/models answered HTTP {listed.status}: {said}", [], key
                    )
                body = await listed.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            return CheckResult(False, "", 0, f"no answer from {url}: {err or type(err).__name__}", [], "")
        # A peer's own peers' models (PEER/MODEL there) are not offered on: a model is reached through one peer,
        # so two clusters that list each other do not list each other's lists round and round.
        names = [
            m["id"]
            for m in body.get("data", [])
            if isinstance(m, dict) and isinstance(m.get("id"), str) and PEER_MARK not in m["id"]
        ]
        return CheckResult(True, cluster, latency, "", names, key)

    def _apply(self, peer: Peer, result: CheckResult, now: datetime) -> None:
        peer.checked = now
        peer.up, peer.error = result.up, result.error
        if result.latency_ns:
            peer.latency_ns = result.latency_ns
        if result.cluster:
            peer.cluster = result.cluster
        if result.key:
            peer.key = result.key
        if not result.up:
            return  # a peer that is down keeps the models it offered
        name = peer.record.name
        offered = {
            f"{name}{PEER_MARK}{upstream}": PeerModel(f"{name}{PEER_MARK}{upstream}", upstream)
            for upstream in result.models
        }
        named = set(self._named_by_fallbacks(name))
        kept = {
            model: PeerModel(model, before.upstream, withdrawn=True)
            for model, before in peer.models.items()
            if model not in offered and model in named
        }
        models = {**kept, **offered}
        if models != peer.models:
            peer.models = models
            peer.synced_at = now

    def _named_by_fallbacks(self, peer: str) -> Iterable[str]:
        for model in self.models:
            for target in fallbacks_of(model):
                if target.partition(PEER_MARK)[0] == peer and PEER_MARK in target:
                    yield target


def _add_problems(name: str, url: str, key_file: str) -> list[str]:
    found = []
    if not name or PEER_MARK in name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        found.append(
            f"name: {name!r} is not a peer name; letters, digits, . _ - (it prefixes the peer's models as NAME/MODEL)"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        found.append(f"url: {url!r} is not the peer's client address; write https://HOST[:PORT], without /v1")
    elif parts.path.rstrip("/").endswith("/v1"):
        found.append(f"url: {url!r} ends in /v1; give the peer's address without it")
    problem = key_reference_problem(key_file)
    if problem:
        found.append(problem)
    return found


def cluster_id(store: Store) -> str:
    """This cluster's id: the one its store keeps, made on the first start of its first leader."""
    return store.meta_once(CLUSTER_META, "cl_" + secrets.token_hex(8))
