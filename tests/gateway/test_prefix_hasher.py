"""The request's block hashes: the contract's hashes of the model's chat tokens, as a worker holding it
tokenizes them, and none where they could not change the choice."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from opod.contract import nodeapi
from opod.contract.blockhash import block_hashes
from opod.contract.tokenizer import Tokenizer, render_chat
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet
from opod.gateway.prefix import PrefixHasher
from opod.http.nodeclient import WorkerClient
from opod.security.signer import Signer

MODEL = "sim-chat"
MESSAGES = [{"role": "system", "content": " ".join(f"rule {i}." for i in range(60))}, {"role": "user", "content": "hi"}]
TOKENS = Tokenizer().encode(render_chat(MESSAGES))


class TokenizingWorker:
    """A worker's tokenize route (the edge of this test): the tokens of the chat, and how often it was asked."""

    def __init__(self) -> None:
        self.asked = 0

    async def tokenize(self, request: web.Request) -> web.Response:
        self.asked += 1
        req = await request.json()
        return web.json_response({"tokens": Tokenizer().encode(render_chat(req["messages"]))})


@pytest.fixture
async def worker() -> AsyncIterator[tuple[str, TokenizingWorker]]:
    fake = TokenizingWorker()
    app = web.Application()
    app.router.add_post(nodeapi.PATH_TOKENIZE, fake.tokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"127.0.0.1:{port}", fake
    await runner.cleanup()


def serving(address: str, *node_ids: str) -> tuple[Fleet, PrefixIndex]:
    fleet, index = Fleet(), PrefixIndex()
    for node_id in node_ids:
        fleet.register(nodeapi.RegisterRequest(id=node_id, address=address, boot_id="b"), "t", nodeapi.Capabilities(engine="vllm"))
        load = nodeapi.EngineLoad(sampled_at=int(time.time()))
        fleet.heartbeat(nodeapi.Heartbeat(id=node_id, boot_id="b", loaded_models=[MODEL], load=load))
        index.apply(node_id, "b", nodeapi.KVBlocks(seq=1, block_size=16, stored=[]))
    return fleet, index


@pytest.fixture
async def workers() -> AsyncIterator[WorkerClient]:
    client = WorkerClient(lambda _: "token", Signer)
    yield client
    await client.close()


async def test_two_workers_get_the_contracts_hashes_of_the_chat_tokens(worker, workers) -> None:
    address, fake = worker
    expected = block_hashes(TOKENS, 16)
    assert len(expected) >= 4
    prefix = PrefixHasher(*serving(address, "a", "b"), workers)
    payload = {"model": MODEL, "messages": MESSAGES}
    assert prefix.hashes_now(MODEL, payload) is None  # a worker must be asked
    assert await prefix.hashes(MODEL, payload) == expected
    assert fake.asked == 1


async def test_a_model_with_one_worker_is_not_hashed(worker, workers) -> None:
    address, fake = worker
    prefix = PrefixHasher(*serving(address, "a"), workers)
    payload = {"model": MODEL, "messages": MESSAGES}
    assert prefix.hashes_now(MODEL, payload) == []  # one place to go: nothing to hash, nobody asked
    assert await prefix.hashes(MODEL, payload) == []
    assert fake.asked == 0


async def test_a_worker_that_does_not_answer_means_no_hashes(workers) -> None:
    fleet, index = serving("127.0.0.1:9", "a", "b")  # nothing listens there
    assert await PrefixHasher(fleet, index, workers).hashes(MODEL, {"model": MODEL, "messages": MESSAGES}) == []


async def test_a_change_in_what_workers_report_applies_to_the_next_request(worker, workers) -> None:
    address, _ = worker
    fleet, index = serving(address, "a", "b")
    prefix = PrefixHasher(fleet, index, workers)
    payload = {"model": MODEL, "messages": MESSAGES}
    assert await prefix.hashes(MODEL, payload) == block_hashes(TOKENS, 16)
    # The engines restart with another block size: the next request is hashed by it.
    for node_id in ("a", "b"):
        index.apply(node_id, "b2", nodeapi.KVBlocks(seq=1, block_size=32, stored=[]))
    assert await prefix.hashes(MODEL, payload) == block_hashes(TOKENS, 32)
    # Nobody reports blocks any more: nothing to match, so nothing is hashed.
    index.forget("a")
    index.forget("b")
    assert await prefix.hashes(MODEL, payload) == []
