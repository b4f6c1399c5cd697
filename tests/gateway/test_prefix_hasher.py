"""The request's block hashes: the contract's hashes of the model's chat tokens as a worker holding it
tokenizes them, learnt off the request's path and looked up in memory, and none where they could not
change the choice."""

from __future__ import annotations

import asyncio
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
from opod.gateway.tokenize import worker_tokenizer
from opod.http.nodeclient import WorkerClient
from opod.security.signer import Signer

MODEL = "sim-chat"
MESSAGES = [{"role": "system", "content": " ".join(f"rule {i}." for i in range(60))}, {"role": "user", "content": "hi"}]
TOKENS = Tokenizer().encode(render_chat(MESSAGES))


class TokenizingWorker:
    """A worker's tokenize route (the edge of this test): the tokens of the chat, and how often it was asked."""

    def __init__(self) -> None:
        self.asked = 0
        self.delay = 0.0

    async def tokenize(self, request: web.Request) -> web.Response:
        self.asked += 1
        req = await request.json()
        await asyncio.sleep(self.delay)
        if "messages" in req:
            return web.json_response({"tokens": Tokenizer().encode(render_chat(req["messages"]))})
        return web.json_response({"tokens": Tokenizer().encode(req["prompt"])})


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
        fleet.register(
            nodeapi.RegisterRequest(id=node_id, address=address, boot_id="b"), "t", nodeapi.Capabilities(engine="vllm")
        )
        load = nodeapi.EngineLoad(sampled_at=int(time.time()))
        fleet.heartbeat(nodeapi.Heartbeat(id=node_id, boot_id="b", loaded_models=[MODEL], load=load))
        index.apply(node_id, "b", nodeapi.KVBlocks(seq=1, block_size=16, stored=[]))
    return fleet, index


def hasher(workers: WorkerClient, address: str, *node_ids: str, **options: int) -> PrefixHasher:
    fleet, index = serving(address, *node_ids)
    return PrefixHasher(fleet, index, worker_tokenizer(fleet, workers), **options)


@pytest.fixture
async def workers() -> AsyncIterator[WorkerClient]:
    client = WorkerClient(lambda _: "token", Signer)
    yield client
    await client.close()


def chat(*messages: dict) -> dict:
    return {"model": MODEL, "messages": list(messages)}


SYSTEM = MESSAGES[0]


async def test_a_request_seen_once_is_hashed_from_memory_the_next_time(worker, workers) -> None:
    address, fake = worker
    prefix = hasher(workers, address, "a", "b")
    payload = chat(*MESSAGES)
    assert prefix.hashes(MODEL, payload) == [], "never seen: routed without hashes, not held up"
    await prefix.settle()
    expected = block_hashes(TOKENS, 16)
    assert len(expected) >= 4
    assert prefix.hashes(MODEL, payload) == expected
    assert fake.asked == 1, "known now: no worker is asked again"


async def test_the_next_turn_is_hashed_by_the_turns_before_it(worker, workers) -> None:
    address, _ = worker
    prefix = hasher(workers, address, "a", "b")
    prefix.hashes(MODEL, chat(*MESSAGES))
    await prefix.settle()
    next_turn = chat(*MESSAGES, {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "more"})
    assert prefix.hashes(MODEL, next_turn) == block_hashes(TOKENS, 16)


async def test_a_shared_system_prompt_is_hashed_for_a_new_conversation(worker, workers) -> None:
    address, _ = worker
    prefix = hasher(workers, address, "a", "b")
    for user in ("where are the hammers?", "do you sell nails?"):
        prefix.hashes(MODEL, chat(SYSTEM, {"role": "user", "content": user}))
        await prefix.settle()
    system_blocks = block_hashes(Tokenizer().encode(render_chat([SYSTEM])), 16)
    new = prefix.hashes(MODEL, chat(SYSTEM, {"role": "user", "content": "and screws?"}))
    # What two conversations have in common: the system prompt's blocks, none of either's question.
    assert len(new) >= 3 and new == block_hashes(TOKENS, 16)[: len(new)]
    assert len(system_blocks) - 1 <= len(new) <= len(system_blocks) + 1


async def test_learning_waits_for_nothing_on_the_requests_path(worker, workers) -> None:
    address, fake = worker
    fake.delay = 1.0
    prefix = hasher(workers, address, "a", "b")
    started = time.perf_counter()
    for i in range(20):
        assert prefix.hashes(MODEL, chat(SYSTEM, {"role": "user", "content": f"question {i}"})) == []
    assert time.perf_counter() - started < 0.5
    for _ in range(50):  # the calls start on the loop's next turns; on a loaded machine, a few turns later
        if fake.asked >= 8:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    assert fake.asked == 8, "at most eight tokenize calls at once; the rest are learnt when they come again"
    await prefix.close()


async def test_a_text_prompt_is_known_when_repeated(worker, workers) -> None:
    address, _ = worker
    prefix = hasher(workers, address, "a", "b")
    text = " ".join(f"word{i}" for i in range(100))
    payload = {"model": MODEL, "prompt": text}
    prefix.hashes(MODEL, payload)
    await prefix.settle()
    assert prefix.hashes(MODEL, payload) == block_hashes(Tokenizer().encode(text), 16)


async def test_what_follows_an_image_part_is_not_hashed(worker, workers) -> None:
    address, _ = worker
    prefix = hasher(workers, address, "a", "b")
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}
    prefix.hashes(MODEL, chat(SYSTEM, image))
    await prefix.settle()
    assert prefix.hashes(MODEL, chat(SYSTEM, image)) == block_hashes(Tokenizer().encode(render_chat([SYSTEM])), 16)


async def test_a_model_with_one_worker_is_not_hashed(worker, workers) -> None:
    address, fake = worker
    prefix = hasher(workers, address, "a")
    assert prefix.hashes(MODEL, chat(*MESSAGES)) == []  # one place to go: nothing to hash, nobody asked
    await prefix.settle()
    assert fake.asked == 0


async def test_a_worker_that_does_not_answer_means_no_hashes(workers) -> None:
    prefix = hasher(workers, "127.0.0.1:9", "a", "b")  # nothing listens there
    assert prefix.hashes(MODEL, chat(*MESSAGES)) == []
    await prefix.settle()
    assert prefix.hashes(MODEL, chat(*MESSAGES)) == []


async def test_a_change_in_what_workers_report_applies_to_the_next_request(worker, workers) -> None:
    address, _ = worker
    fleet, index = serving(address, "a", "b")
    prefix = PrefixHasher(fleet, index, worker_tokenizer(fleet, workers))
    payload = chat(*MESSAGES)
    prefix.hashes(MODEL, payload)
    await prefix.settle()
    assert prefix.hashes(MODEL, payload) == block_hashes(TOKENS, 16)
    # The engines restart with another block size: the request is learnt again, by it.
    for node_id in ("a", "b"):
        index.apply(node_id, "b2", nodeapi.KVBlocks(seq=1, block_size=32, stored=[]))
    assert prefix.hashes(MODEL, payload) == []
    await prefix.settle()
    assert prefix.hashes(MODEL, payload) == block_hashes(TOKENS, 32)
    # Nobody reports blocks any more: nothing to match, so nothing is hashed.
    index.forget("a")
    index.forget("b")
    assert prefix.hashes(MODEL, payload) == []


async def test_the_least_recently_used_prefixes_are_forgotten_first(worker, workers) -> None:
    address, _ = worker
    prefix = hasher(workers, address, "a", "b", kept=3)
    first = chat(SYSTEM, {"role": "user", "content": "first"})
    prefix.hashes(MODEL, first)
    await prefix.settle()
    for i in range(3):
        prefix.hashes(MODEL, {"model": MODEL, "prompt": f"other prompt {i} " * 40})
        await prefix.settle()
    assert prefix.hashes(MODEL, first) == [], "its two prefixes made room for three others"


async def test_a_short_prompt_is_never_learnt_and_a_conversation_once_it_is_long(worker, workers) -> None:
    address, fake = worker
    prefix = hasher(workers, address, "a", "b")
    hello = {"role": "user", "content": "17: hello there, how are you"}
    for _ in range(3):
        assert prefix.hashes(MODEL, chat(hello)) == []
        await prefix.settle()
    assert fake.asked == 0, "a prompt of a few tokens: a cache hit on it is worth less than the tokenize call"
    answer = {"role": "assistant", "content": " ".join(f"point {i}." for i in range(40))}
    longer = chat(hello, answer, {"role": "user", "content": "and then?"})
    prefix.hashes(MODEL, longer)
    await prefix.settle()
    assert fake.asked == 1
    assert prefix.hashes(MODEL, longer) == block_hashes(Tokenizer().encode(render_chat(longer["messages"])), 16)
    assert prefix.hashes(MODEL, chat(hello)) == [], "its opening is known now, and still too short to place by itself"
