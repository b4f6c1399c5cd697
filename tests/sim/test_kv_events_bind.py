"""``--kv-events-bind``: one PUB socket that connects to opod's worker and binds for an outside subscriber (vllm-router)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
import zmq

from opod.sim import SimConfig, SimConfigError, build_app
from tests.sim.conftest import FAST
from tests.sim.test_kv_events import complete, decode, receive


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def _sub(ctx: zmq.Context) -> zmq.Socket:
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def _raw(sock: zmq.Socket, timeout_ms: int = 2000) -> list[list[bytes]]:
    out = []
    while sock.poll(timeout_ms):
        out.append(sock.recv_multipart())
        timeout_ms = 150
    return out


def test_a_bound_and_a_connecting_subscriber_receive_identical_frames(sim, ctx) -> None:
    worker = _sub(ctx)  # opod's worker: its SUB binds, the engine dials in
    port = worker.bind_to_random_port("tcp://127.0.0.1")
    h = sim(
        kv_events=f"tcp://127.0.0.1:{port}",
        kv_events_bind="tcp://127.0.0.1:*",
        kv_events_topic="kv-events",
        block_size=16,
        output_min=1,
        output_max=1,
    )
    bound = httpx.get(h.url + "/sim/state").json()["kv_events_bind"]
    assert bound.startswith("tcp://127.0.0.1:") and not bound.endswith(":*")
    router = _sub(ctx)  # vllm-router: its SUB connects to the engine
    router.connect(bound)

    # Subscriptions reach the publisher a moment after connecting: warm up until both hear something.
    heard = [False, False]
    for attempt in range(40):
        complete(h.url, list(range(1000 * attempt + 1, 1000 * attempt + 40)))
        heard = [heard[0] or bool(_raw(worker, 100)), heard[1] or bool(_raw(router, 100))]
        if all(heard):
            break
    assert all(heard), f"a subscriber heard nothing (worker, router) = {heard}"
    _raw(worker, 300)  # drain what the warm-up left
    _raw(router, 300)

    for i in range(5):
        complete(h.url, list(range(100_000 + 100 * i, 100_000 + 100 * i + 70)))
    assert httpx.post(h.url + "/reset_prefix_cache").json() == {"success": True}
    complete(h.url, list(range(1, 50)))  # the clear goes out with this step
    at_worker, at_router = _raw(worker), _raw(router)
    assert at_worker, "no events after the warm-up"
    assert at_router == at_worker  # topic, sequence number and payload, frame for frame
    seqs = [decode(f)["seq"] for f in at_worker]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    kinds = {e["type"] for f in at_worker for e in decode(f)["batch"][1]}
    assert {"BlockStored", "AllBlocksCleared"} <= kinds


def test_the_bound_endpoint_alone_publishes_and_is_the_one_kv_event_sources_names(sim, ctx) -> None:
    h = sim(kv_events_bind="tcp://127.0.0.1:*", block_size=16, output_min=1, output_max=1)
    state = httpx.get(h.url + "/sim/state").json()
    assert state["kv_events"] is None and state["kv_events_bind"].startswith("tcp://127.0.0.1:")
    assert httpx.get(h.url + "/kv_event_sources").json()["0"]["endpoint"] == "tcp://127.0.0.1:*"
    sub = _sub(ctx)
    sub.connect(state["kv_events_bind"])
    messages = []
    for attempt in range(40):
        complete(h.url, list(range(1000 * attempt + 1, 1000 * attempt + 40)))
        messages = receive(sub, 100)
        if messages:
            break
    assert messages and messages[0]["batch"][1][0]["type"] == "BlockStored"


def test_a_taken_port_is_a_config_error_naming_the_option() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            SimConfigError, match=rf"--kv-events-bind: cannot open tcp://127.0.0.1:{port}: Address already in use"
        ):
            build_app(SimConfig(**FAST, kv_events_bind=f"tcp://127.0.0.1:{port}"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kv_events_bind": "127.0.0.1:5557"}, "--kv-events-bind must be a ZMQ endpoint"),
        (
            {"kv_events": "tcp://*:5557", "kv_events_bind": "tcp://*:5557"},
            "--kv-events-bind must differ from --kv-events",
        ),
        ({"kv_events_replay": "tcp://*:5558"}, "--kv-events-replay needs --kv-events or --kv-events-bind"),
    ],
)
def test_bad_bind_options_name_the_option(options: dict, message: str) -> None:
    with pytest.raises(SimConfigError, match=message):
        SimConfig(**FAST, **options).validate()  # type: ignore[arg-type]


def test_opod_sim_announces_both_endpoints(sim_process) -> None:
    p = sim_process("--kv-events-bind", "tcp://127.0.0.1:*")
    assert "KV events tcp://127.0.0.1:*" in p.banner
    assert httpx.get(p.url + "/sim/state").json()["kv_events_bind"].startswith("tcp://127.0.0.1:")
