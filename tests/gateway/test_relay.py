"""A /v1 request through a gateway built as the leader builds it, to a simulated engine on this machine:
the answer, its usage row, the worker given back, and the next worker after a failure before the first byte."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from opod.access.keytable import KeyTable
from opod.contract import nodeapi
from opod.contract.adminapi import PlanSnapshot, PolicyAdmission, PolicySnapshot
from opod.fleet.local import LocalEngines
from opod.fleet.models import KnownModel, ModelRegistry
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet
from opod.gateway import relay
from opod.gateway.app import Gateway
from opod.gateway.build import build_gateway
from opod.http.fastpath import FastPath
from opod.http.nodeclient import WorkerClient
from opod.http.serving import Listener, bind, serve
from opod.ledger.records import UsageTicket
from opod.security.signer import Signer
from opod.sim import SimConfig, running
from opod.snapshots.policy import PolicyView, build_view
from tests.snapshots.helpers import serving

MODEL = "sim-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8}


@dataclass
class Row:
    request_id: str
    model: str
    ended: dict = field(default_factory=dict)
    progress: list[dict] = field(default_factory=list)


class Usage:
    """The ledger's side of the gateway (the edge here): rows begun and ended."""

    def __init__(self) -> None:
        self.rows: list[Row] = []

    def begin(
        self, *, request_id: str, api_key_id: str, user_id: str, model: str, protocol: str, **attributed: object
    ) -> UsageTicket:
        self.rows.append(Row(request_id, model))
        return UsageTicket(str(len(self.rows) - 1), request_id, api_key_id, user_id, model, protocol, 0)

    def end(self, ticket: UsageTicket, **ended: object) -> None:
        self.rows[int(ticket.entry)].ended = dict(ended)

    def progress(self, ticket: UsageTicket, **progress: object) -> None:
        self.rows[int(ticket.entry)].progress.append(dict(progress))


class NoFiles:
    def current_policy(self) -> PolicyView | None:
        return None

    def current_plan(self) -> PlanSnapshot | None:
        return None


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    # Tokens 30 ms apart: a stream is still coming while the test looks at the fleet.
    config = SimConfig(
        port=0, models=(MODEL,), ttft_ms=0.0, prefill_ms_per_token=0.0, itl_ms=30.0, itl_ms_per_request=0.0
    )
    with running(config) as handle:
        yield handle.url


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def join(fleet: Fleet, node_id: str, address: str, queue: int = 0) -> None:
    fleet.register(
        nodeapi.RegisterRequest(id=node_id, address=address, boot_id="b"), "t", nodeapi.Capabilities(engine="sim")
    )
    fleet.heartbeat(
        nodeapi.Heartbeat(
            id=node_id, boot_id="b", loaded_models=[MODEL], slots=4, load=nodeapi.EngineLoad(queue_depth=queue)
        )
    )


@dataclass
class Setup:
    fleet: Fleet
    local: LocalEngines
    gateway: Gateway
    usage: Usage
    client: httpx.AsyncClient


def gateway_on(
    fleet: Fleet, local: LocalEngines, usage: Usage, workers: WorkerClient, policies: Any = None, **rules: Any
) -> Gateway:
    """A gateway built as the leader builds it, over ``fleet``'s workers and ``local``'s engines; ``policies``: the
    mounted files it reads (none by default)."""
    return build_gateway(
        fleet=fleet,
        models=ModelRegistry(),
        keys=KeyTable(),
        workers=workers,
        index=PrefixIndex(),
        local=local,
        usage=usage,
        policies=policies or NoFiles(),
        admission=PolicyAdmission(hold_ms=5000),
        **rules,
    )


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    fleet, local, usage = Fleet(), LocalEngines(), Usage()
    workers = WorkerClient(lambda _: "node-token", Signer)
    gateway = gateway_on(fleet, local, usage, workers, require_keys=False)
    # Served as the leader's public listener serves /v1: the hot routes' short way in front of Starlette.
    sock = bind("127.0.0.1", 0, "the test's public listener")
    stop = asyncio.Event()
    server = asyncio.create_task(
        serve([Listener(FastPath(gateway.handlers(), Starlette(routes=gateway.routes())), sock, "public")], stop)
    )
    await asyncio.sleep(0.05)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}") as client:
        yield Setup(fleet, local, gateway, usage, client)
    stop.set()
    await server
    await gateway.guardrails.close()
    await workers.close()


def in_flight(setup: Setup) -> dict[str, int]:
    return {node.id: node.in_flight for node in setup.fleet}


async def test_an_answer_is_relayed_recorded_once_and_the_worker_given_back(setup: Setup, sim: str) -> None:
    join(setup.fleet, "here", "127.0.0.1:1")
    setup.local.attach("here", lambda model: sim if model == MODEL else None)
    response = await setup.client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "r1"})
    assert response.status_code == 200, response.text
    assert response.headers["x-opod-worker"] == "here" and response.headers["x-request-id"] == "r1"
    assert int(response.headers["content-length"]) == len(response.content)
    assert response.headers["content-type"] == "application/json"
    assert "worker=here" in response.headers["x-opod-route"] and "upstream;dur=" in response.headers["server-timing"]
    assert response.json()["choices"][0]["message"]["content"]
    [row] = setup.usage.rows
    assert row.request_id == "r1" and row.ended["outcome"] == "ok" and row.ended["node_id"] == "here"
    assert row.ended["completion_tokens"] > 0 and row.ended["route"]["worker"] == "here"
    assert in_flight(setup) == {"here": 0}
    assert setup.gateway.admission.stats()[MODEL].in_use == 0


async def test_a_stream_holds_its_worker_until_it_ends(setup: Setup, sim: str) -> None:
    join(setup.fleet, "here", "127.0.0.1:1")
    setup.local.attach("here", lambda model: sim)
    stream = {**CHAT, "stream": True}
    async with setup.client.stream(
        "POST", "/v1/chat/completions", json=stream, headers={"X-Request-Id": "s1"}
    ) as response:
        assert response.status_code == 200
        headers = response.headers
        assert headers["content-type"] == "text/event-stream; charset=utf-8" and headers["cache-control"] == "no-cache"
        assert headers["x-request-id"] == "s1" and headers["x-opod-worker"] == "here"
        assert "worker=here" in headers["x-opod-route"] and headers["server-timing"].startswith("opod;dur=")
        assert in_flight(setup) == {"here": 1}
        events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    # The client did not ask for usage: the chunk opod asked for to count tokens is not passed on.
    assert not any('"usage"' in e and not json.loads(e[6:]).get("choices") for e in events[:-1])
    [row] = setup.usage.rows
    assert row.ended["outcome"] == "ok" and row.ended["completion_tokens"] > 0 and row.ended["ttft_ms"] >= 0
    assert in_flight(setup) == {"here": 0}


async def test_a_worker_that_cannot_be_reached_hands_the_request_to_the_next(setup: Setup, sim: str) -> None:
    join(setup.fleet, "gone", f"127.0.0.1:{closed_port()}")  # the least loaded: tried first
    join(setup.fleet, "here", "127.0.0.1:1", queue=3)
    setup.local.attach("here", lambda model: sim)
    response = await setup.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200 and response.headers["x-opod-worker"] == "here"
    [row] = setup.usage.rows
    assert row.ended["outcome"] == "ok" and row.ended["node_id"] == "here"
    assert in_flight(setup) == {"gone": 0, "here": 0}


async def test_a_stream_whose_engine_sends_no_first_byte_moves_to_the_next_worker(
    setup: Setup, sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay, "FIRST_BYTE_TIMEOUT", 0.3)

    async def stalled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head of a stream, then nothing: a stalled engine
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(stalled, "127.0.0.1", 0)
    stall_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    join(setup.fleet, "stalled", "127.0.0.1:1")  # the least loaded: tried first
    join(setup.fleet, "here", "127.0.0.1:2", queue=3)
    setup.local.attach("stalled", lambda model: stall_url)
    setup.local.attach("here", lambda model: sim)
    async with setup.client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.status_code == 200 and response.headers["x-opod-worker"] == "here"
        events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    [row] = setup.usage.rows
    assert row.ended["outcome"] == "ok" and row.ended["node_id"] == "here"
    assert in_flight(setup) == {"stalled": 0, "here": 0}
    server.close()


async def test_an_in_process_worker_without_the_model_is_a_503_that_says_so(setup: Setup) -> None:
    join(setup.fleet, "here", "127.0.0.1:1")
    setup.local.attach("here", lambda model: None)  # its engine is not serving yet
    response = await setup.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503 and "Retry-After" in response.headers
    assert "here: model_not_loaded" in response.json()["error"]["message"]
    [row] = setup.usage.rows
    assert row.ended["outcome"] == "error"
    assert in_flight(setup) == {"here": 0}


OTHER = "sim-other"


@pytest.fixture
def sims() -> Iterator[tuple[str, str]]:
    """Two engines of the same model (as on two workers), the first also serving a second model; faults set per test."""
    config = SimConfig(
        port=0, models=(MODEL, OTHER), ttft_ms=0.0, prefill_ms_per_token=0.0, itl_ms=1.0, itl_ms_per_request=0.0
    )
    with running(config) as first, running(SimConfig(port=0, models=(MODEL,), ttft_ms=0.0, itl_ms=1.0)) as second:
        yield first.url, second.url


async def faults(url: str, **settings: object) -> None:
    async with httpx.AsyncClient() as client:
        assert (await client.post(url + "/sim/faults", json=settings)).status_code == 200


def failures(setup: Setup, node_id: str, model: str = MODEL) -> int:
    node = setup.fleet.get(node_id)
    assert node is not None
    health = node.health.get(model)
    return health.failures if health is not None else 0


async def test_an_engine_that_refuses_the_content_is_a_400_that_names_it_and_never_counts_against_the_worker(
    setup: Setup, sims: tuple[str, str]
) -> None:
    join(setup.fleet, "here", "127.0.0.1:1")
    join(setup.fleet, "there", "127.0.0.1:2", queue=3)
    setup.local.attach("here", lambda model: sims[0])
    setup.local.attach("there", lambda model: sims[1])
    await faults(sims[0], fail_next=5, fail_status=400)
    for _ in range(5):
        response = await setup.client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and "injected failure" in error["message"]
        assert response.headers["x-opod-worker"] == "here", (
            "the same model refuses the same input anywhere: no other worker is tried"
        )
    assert failures(setup, "here") == 0 and setup.fleet.serves(MODEL)
    response = await setup.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200 and response.headers["x-opod-worker"] == "here"
    assert [row.ended["outcome"] for row in setup.usage.rows] == ["error"] * 5 + ["ok"]
    assert in_flight(setup) == {"here": 0, "there": 0}


async def test_a_live_engines_500_moves_on_once_and_is_charged_only_when_another_worker_serves_the_request(
    setup: Setup, sims: tuple[str, str]
) -> None:
    join(setup.fleet, "here", "127.0.0.1:1")
    join(setup.fleet, "there", "127.0.0.1:2", queue=3)
    setup.local.attach("here", lambda model: sims[0])
    setup.local.attach("there", lambda model: sims[1])
    await faults(sims[0], fail_next=1, fail_status=500)
    response = await setup.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200 and response.headers["x-opod-worker"] == "there"
    assert failures(setup, "here") == 1, "served elsewhere: the first engine's error was its own"
    await faults(sims[0], fail_next=1, fail_status=500)
    await faults(sims[1], fail_next=1, fail_status=500)
    response = await setup.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 400, response.text
    assert "HTTP 500" in response.json()["error"]["message"]
    assert failures(setup, "there") == 0, "two engines answered the same input with an error: the input is at fault"


async def test_three_failures_of_one_model_leave_the_other_model_on_the_same_worker_answering(
    setup: Setup, sims: tuple[str, str]
) -> None:
    join(setup.fleet, "here", "127.0.0.1:1")
    node = setup.fleet.get("here")
    assert node is not None
    setup.fleet.heartbeat(nodeapi.Heartbeat(id="here", boot_id="b", loaded_models=[MODEL, OTHER], slots=4))
    setup.gateway.models.put(KnownModel(id=MODEL))  # added: a model that cannot serve now is a 503, not a 404
    dead = f"http://127.0.0.1:{closed_port()}"
    setup.local.attach("here", lambda model: dead if model == MODEL else sims[0])
    for _ in range(3):
        assert (await setup.client.post("/v1/chat/completions", json=CHAT)).status_code == 503
    answer = await setup.client.post("/v1/chat/completions", json={**CHAT, "model": OTHER})
    assert answer.status_code == 200, answer.text
    down = await setup.client.post("/v1/chat/completions", json=CHAT)
    assert down.status_code == 503
    assert "cooling down after 3 failed requests" in down.json()["error"]["message"]
    assert 1 <= int(down.headers["retry-after"]) <= 10


class PostGuardrail:
    """A mounted policy whose one guardrail judges each whole answer, at ``url``."""

    def __init__(self, url: str) -> None:
        snapshot = PolicySnapshot.from_wire({"guardrails": [{"id": "slow", "phase": "post", "url": url}]})
        self.view = build_view(snapshot)

    def current_policy(self) -> PolicyView | None:
        return self.view

    def current_plan(self) -> PlanSnapshot | None:
        return None


async def test_the_answers_server_timing_counts_what_the_gateway_did_after_the_engine_answered(sim: str) -> None:
    # A post guardrail that takes 300 ms is the gateway's time, not the engine's: it shows in opod;dur.
    async def judge(request: Request) -> Response:
        await asyncio.sleep(0.3)
        return JSONResponse({"action": "allow"})

    fleet, local, usage = Fleet(), LocalEngines(), Usage()
    workers = WorkerClient(lambda _: "node-token", Signer)
    async with serving(Starlette(routes=[Route("/judge", judge, methods=["POST"])])) as hook:
        gateway = gateway_on(fleet, local, usage, workers, PostGuardrail(f"{hook}/judge"), require_keys=False)
        join(fleet, "here", "127.0.0.1:1")
        local.attach("here", lambda model: sim)
        async with serving(FastPath(gateway.handlers(), Starlette(routes=gateway.routes()))) as url:
            async with httpx.AsyncClient(base_url=url) as client:
                response = await client.post("/v1/chat/completions", json=CHAT)
        await gateway.guardrails.close()
        await workers.close()
    assert response.status_code == 200, response.text
    parts = dict(part.strip().split(";dur=") for part in response.headers["server-timing"].split(","))
    assert float(parts["opod"]) >= 300, parts
    assert float(parts["upstream"]) < 300, parts  # the engine answered at once
