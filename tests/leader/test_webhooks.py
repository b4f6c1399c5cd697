"""Webhooks as a receiver sees them: signed JSON events, retried with back-off, never holding up the emitter.

A real HTTP receiver on loopback (aiohttp, in the test's loop) answers as each test scripts it; the
signature is checked the way docs/webhooks.md tells a receiver to, not through opod's own code.
The last test kills a real leader's sim worker and waits for the leader's ``node.lost``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiohttp import web

from bench.ports import free_port
from opod.contract import nodeapi
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet
from opod.leader.reconciler import PARK_AFTER, Reconciler
from opod.leader.webhooks import Backoff, LifecycleWatch, Webhooks
from opod.security.sealing import load_or_create_key
from opod.settings.schema import Webhook
from opod.store import Store
from tests.leader.test_reconciler import Workers, model, node
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import remove_home, sim_worker, wait_until

FAST = Backoff(attempts=4, first=0.05, most=0.2)


def verified(secret: str, header: str, body: bytes, now: float | None = None, tolerance: float = 300) -> bool:
    """A receiver's check, as docs/webhooks.md writes it: HMAC-SHA256 of "<t>." + body, and t recent."""
    parts = dict(part.split("=", 1) for part in header.split(","))
    expected = hmac.new(secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
    fresh = abs((now or time.time()) - int(parts["t"])) <= tolerance
    return fresh and hmac.compare_digest(expected, parts["v1"])


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Answers each POST with the next of ``statuses`` (200 once they run out), or hangs while ``hang`` is set."""

    url: str
    statuses: list[int] = field(default_factory=list)
    got: list[Received] = field(default_factory=list)
    hang: asyncio.Event | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append(Received(dict(request.headers), await request.read()))
        self.arrived.set()
        if self.hang is not None:
            await self.hang.wait()
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200, text="no" if self.statuses else "")

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        async with asyncio.timeout(timeout):
            while len(self.got) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.got


@pytest.fixture
async def receivers() -> AsyncIterator[list[Receiver]]:
    """Call ``make()`` for each receiver the test needs: each on its own path of one loopback server."""
    made: list[Receiver] = []
    app = web.Application()
    port = free_port()

    async def route(request: web.Request) -> web.Response:
        return await made[int(request.match_info["n"])].handle(request)

    app.router.add_post("/hook/{n}", route)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}/hook/"

    class Made(list):
        def make(self, **kw) -> Receiver:
            receiver = Receiver(url=f"{base}{len(made)}", **kw)
            made.append(receiver)
            return receiver

    out = Made()
    yield out  # type: ignore[misc]
    for receiver in made:
        if receiver.hang is not None:
            receiver.hang.set()
    await runner.cleanup()


@pytest.fixture
async def running() -> AsyncIterator:
    """``start(webhooks)`` runs its delivery until the test ends."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task] = []

    def start(hooks: Webhooks) -> Webhooks:
        tasks.append(asyncio.create_task(hooks.run(stop)))
        return hooks

    yield start
    stop.set()
    await asyncio.gather(*tasks)


async def test_an_event_arrives_signed_and_the_signature_verifies(receivers, running) -> None:
    receiver = receivers.make()
    hooks = running(Webhooks(lambda: [Webhook(url=receiver.url, secret="s3cret")], {}.get, backoff=FAST))
    hooks.offer("node.lost", "gpu-7", {"reason": "no heartbeat for 16s (limit 15s)"})
    (got,) = await receiver.wait_for(1)
    assert got.event["type"] == "node.lost" and got.event["subject"] == "gpu-7"
    assert got.event["data"] == {"reason": "no heartbeat for 16s (limit 15s)"}
    assert got.event["at"].endswith("Z")
    assert got.headers["X-Opod-Event"] == "node.lost" and got.headers["Content-Type"] == "application/json"
    assert verified("s3cret", got.headers["X-Opod-Signature"], got.body)
    assert not verified("wrong", got.headers["X-Opod-Signature"], got.body)
    assert not verified("s3cret", got.headers["X-Opod-Signature"], got.body.replace(b"gpu-7", b"gpu-8"))
    await wait_for(lambda: hooks.counts.delivered == 1)


async def test_a_stored_secret_signs_and_a_missing_one_sends_nothing(
    receivers, running, caplog, tmp_path: Path
) -> None:
    signed, unset = receivers.make(), receivers.make()
    store = Store.open(f"sqlite:///{tmp_path / 'opod.db'}", secrets_key=load_or_create_key(tmp_path))
    store.put_secret("hooks/ops", "from-the-store")
    hooks = running(
        Webhooks(
            lambda: [
                Webhook(url=signed.url, secret="store:hooks/ops"),
                Webhook(url=unset.url, secret="store:hooks/none"),
            ],
            store.get_secret,
            backoff=Backoff(attempts=2, first=0.01, most=0.01),
        )
    )
    with caplog.at_level(logging.WARNING, "opod.webhooks"):
        hooks.offer("quota.hit", "team:acme/ml", {"resource": "gpus"})
        (got,) = await signed.wait_for(1)
        assert verified("from-the-store", got.headers["X-Opod-Signature"], got.body)
        await wait_for(lambda: hooks.counts.failed == 1)
    assert unset.got == []  # never sent unsigned
    store.close()
    assert "store:hooks/none is not stored; store it with PUT /api/v1/auth/secrets/hooks/none" in caplog.text


async def test_a_failing_receiver_is_retried_with_back_off_then_succeeds(receivers, running) -> None:
    receiver = receivers.make(statuses=[500, 503])
    hooks = running(Webhooks(lambda: [Webhook(url=receiver.url, secret="k")], {}.get, backoff=FAST, seed=1))
    started = time.monotonic()
    hooks.offer("model.parked", "llama-70b", {"failures": 3})
    got = await receiver.wait_for(3)
    took = time.monotonic() - started
    assert [r.body for r in got] == [got[0].body] * 3  # the same event each time
    assert len({r.headers["X-Opod-Delivery"] for r in got}) == 1
    assert all(verified("k", r.headers["X-Opod-Signature"], r.body) for r in got)
    assert took >= 0.025 + 0.05  # two back-offs, each at least half its doubled delay
    await wait_for(lambda: hooks.counts.delivered == 1)
    assert (hooks.counts.retried, hooks.counts.failed) == (2, 0)


async def test_a_receiver_that_keeps_failing_is_given_up_on_after_the_last_attempt(receivers, running, caplog) -> None:
    receiver = receivers.make(statuses=[500] * 10)
    hooks = running(
        Webhooks(lambda: [Webhook(url=receiver.url)], {}.get, backoff=Backoff(attempts=3, first=0.01, most=0.02))
    )
    with caplog.at_level(logging.WARNING, "opod.webhooks"):
        hooks.offer("budget.crossed", "org:acme", {"period": "month"})
        await wait_for(lambda: hooks.counts.failed == 1)
    assert len(receiver.got) == 3
    assert "X-Opod-Signature" not in receiver.got[0].headers  # no secret, no signature
    assert f"webhook {receiver.url}: gave up on budget.crossed" in caplog.text and "answered 500" in caplog.text


async def test_the_emitter_is_never_blocked_and_a_dead_receiver_holds_up_no_other(receivers, running, caplog) -> None:
    stuck = receivers.make(hang=asyncio.Event())
    healthy = receivers.make()
    hooks = running(
        Webhooks(
            lambda: [Webhook(url=stuck.url), Webhook(url=healthy.url, events=["node.lost"])],
            {}.get,
            backoff=FAST,
            lane_size=16,
        )
    )
    hooks.offer("node.lost", "n0", {})
    await stuck.wait_for(1)  # its first event hangs in flight
    started = time.monotonic()
    threads = [
        threading.Thread(target=lambda: [hooks.offer("quota.hit", "p", {}) for _ in range(500)]) for _ in range(2)
    ]
    with caplog.at_level(logging.WARNING, "opod.webhooks"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for i in range(5):
            hooks.offer("node.lost", f"n{i + 1}", {})
    assert time.monotonic() - started < 1.0  # 1005 offers against a dead receiver
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        f"webhook {stuck.url}: quota.hit p dropped, 16 events already wait for it (the next drops are only counted)"
    ]
    got = await healthy.wait_for(6)
    assert [r.event["subject"] for r in got] == [f"n{i}" for i in range(6)]
    assert hooks.counts.dropped == 1005 - 16  # the stuck lane holds 16 more; the rest are counted, not kept


async def test_only_operator_events_of_the_listed_types_are_sent(receivers, running) -> None:
    parked_only, everything = receivers.make(), receivers.make()
    hooks = running(
        Webhooks(lambda: [Webhook(url=parked_only.url, events=["model.parked"]), Webhook(url=everything.url)], {}.get)
    )
    for kind in ("admin.call", "node.lost", "model.loaded", "model.parked", "quota.hit"):
        hooks.offer(kind, "s", {})
    assert [r.event["type"] for r in await everything.wait_for(3)] == ["node.lost", "model.parked", "quota.hit"]
    assert [r.event["type"] for r in parked_only.got] == ["model.parked"]


async def test_notify_test_reports_how_each_receiver_answered(receivers) -> None:
    good, bad = receivers.make(), receivers.make(statuses=[500])
    gone = f"http://127.0.0.1:{free_port()}/hook"
    hooks = Webhooks(lambda: [Webhook(url=good.url, secret="t"), Webhook(url=bad.url), Webhook(url=gone)], {}.get)
    answers = dict(await hooks.test())
    assert answers[good.url] == ""
    assert answers[bad.url].startswith("answered 500")
    assert answers[gone].startswith("cannot reach it")
    assert good.got[0].event["type"] == "notify.test" and verified(
        "t", good.got[0].headers["X-Opod-Signature"], good.got[0].body
    )


def test_the_watch_emits_node_lost_and_model_parked_once_per_transition() -> None:
    fleet = Fleet()
    for node_id in ("a", "b"):
        fleet.register(
            nodeapi.RegisterRequest(id=node_id, address=f"{node_id}:8081", boot_id="x"), "tok", nodeapi.Capabilities()
        )
        fleet.heartbeat(nodeapi.Heartbeat(id=node_id, loaded_models=[], boot_id="x"))
    parked: list[tuple[str, int, str]] = []
    events: list[tuple[str, str, dict]] = []
    watch = LifecycleWatch(fleet, lambda: parked, lambda t, s, d: events.append((t, s, dict(d or {}))))
    now = time.monotonic()
    watch.look(now)
    assert events == []
    b = fleet.get("b")
    assert b is not None
    b.goodbye = True  # left in order: not lost
    watch.look(now + 16)
    assert [(t, s) for t, s, _ in events] == [("node.lost", "a")]
    assert events[0][2]["reason"].startswith("no heartbeat for 16s")
    parked.append(("m", 3, "the engine exited with 1"))
    watch.look(now + 17)
    watch.look(now + 18)
    assert [(t, s) for t, s, _ in events] == [("node.lost", "a"), ("model.parked", "m")]
    assert events[1][2] == {"model": "m", "failures": 3, "reason": "the engine exited with 1"}


async def test_a_model_the_reconciler_parks_reaches_the_webhook(receivers, running) -> None:
    receiver = receivers.make()
    hooks = running(Webhooks(lambda: [Webhook(url=receiver.url, secret="p")], {}.get, backoff=FAST))
    fleet, registry, workers = Fleet(), ModelRegistry(), Workers()
    reconciler = Reconciler(fleet, registry, workers)  # type: ignore[arg-type]
    watch = LifecycleWatch(fleet, reconciler.parked, hooks.offer)
    node(fleet, "n1")
    model(registry, "broken")
    workers.refuse.add("broken")
    watch.look()
    for _ in range(PARK_AFTER):
        if parking := reconciler.parking.get("broken"):
            parking.next_try = 0.0  # no waiting out the start back-off
        await reconciler.reconcile()
        await reconciler.reconcile()
        watch.look()
    (got,) = await receiver.wait_for(1)
    assert got.event["type"] == "model.parked" and got.event["subject"] == "broken"
    assert got.event["data"]["failures"] == PARK_AFTER and "engine would not start" in got.event["data"]["reason"]
    assert verified("p", got.headers["X-Opod-Signature"], got.body)


async def wait_for(predicate, timeout: float = 10.0) -> None:
    """Until ``predicate()`` holds: the counters change inside opod, with no event a test could await."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


# --- a real leader --------------------------------------------------------------------------------


class _Collect(BaseHTTPRequestHandler):
    got: list[tuple[dict[str, str], bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.got.append(({k: v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, list]]:
    got: list[tuple[dict[str, str], bytes]] = []
    handler = type("Collect", (_Collect,), {"got": got})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/opod", got
    server.shutdown()
    server.server_close()


def put_settings(leader: Leader, body: str) -> None:
    status, current = leader.admin("GET", "/api/v1/settings")
    assert status == 200, current
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": current.get("version", 0), "body": body})
    assert status == 200, answer


def test_a_real_leader_signs_notify_test_and_sends_node_lost_when_its_worker_is_killed(
    tmp_path: Path, http_receiver
) -> None:
    url, got = http_receiver
    leader = Leader(tmp_path / "leader", default_models=True)
    worker = None
    try:
        worker = sim_worker(leader, tmp_path / "worker", "sim-lost")
        wait_until(
            lambda: any(n.get("id") == "sim-lost" for n in leader.admin("GET", "/api/v1/nodes")[1] or []),
            60,
            "the worker to join",
        )
        put_settings(leader, f"webhooks:\n  - url: {url}\n    secret: hook-secret\n")
        status, answers = wait_until(
            lambda: (r := leader.admin("POST", "/api/v1/notify/test", {})) and r[1] and r,
            10,
            "the webhook to be in force",
        )
        assert status == 200 and answers == [{"url": url}]  # no error
        headers, body = got[0]
        assert json.loads(body)["type"] == "notify.test" and verified("hook-secret", headers["X-Opod-Signature"], body)
        worker.kill()
        lost = wait_until(
            lambda: [json.loads(b) for _, b in got if json.loads(b)["type"] == "node.lost"], 40, "node.lost"
        )
        assert lost[0]["subject"] == "sim-lost" and "no heartbeat" in lost[0]["data"]["reason"]
        assert all(verified("hook-secret", h["X-Opod-Signature"], b) for h, b in got)

        def delivered() -> float | None:
            text = urllib.request.urlopen(leader.url + "/metrics", timeout=10).read().decode()
            found = re.search(r'^opod_webhook_events_total\{outcome="delivered"\} (\S+)$', text, re.M)
            return float(found.group(1)) if found and float(found.group(1)) >= 1 else None

        assert wait_until(delivered, 10, "the delivery counted on /metrics") >= 1
    finally:
        if worker is not None and worker.proc.poll() is None:
            worker.stop()
        leader.stop()
        remove_home(tmp_path / "leader")
