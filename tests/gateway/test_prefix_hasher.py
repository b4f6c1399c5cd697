"""The request's block hashes: the contract's hashes of the model's chat tokens, and none where they could not change the choice."""

from __future__ import annotations

import asyncio
import time

from opod.contract import nodeapi
from opod.contract.blockhash import block_hashes
from opod.contract.tokenizer import Tokenizer, render_chat
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet
from opod.gateway.prefix import PrefixHasher

MODEL = "sim-chat"
MESSAGES = [{"role": "system", "content": " ".join(f"rule {i}." for i in range(60))}, {"role": "user", "content": "hi"}]


def serving(*node_ids: str, engine: str = "sim") -> tuple[Fleet, PrefixIndex]:
    fleet, index = Fleet(), PrefixIndex()
    for port, node_id in enumerate(node_ids, 9000):
        fleet.register(nodeapi.RegisterRequest(id=node_id, address=f"127.0.0.1:{port}", boot_id="b"), "t", nodeapi.Capabilities(engine=engine))
        load = nodeapi.EngineLoad(sampled_at=int(time.time()))
        fleet.heartbeat(nodeapi.Heartbeat(id=node_id, boot_id="b", loaded_models=[MODEL], load=load))
        index.apply(node_id, "b", nodeapi.KVBlocks(seq=1, block_size=16, stored=[]))
    return fleet, index


def hashes_for(fleet: Fleet, index: PrefixIndex) -> list[str]:
    return asyncio.run(PrefixHasher(fleet, index, workers=None).hashes(MODEL, {"model": MODEL, "messages": MESSAGES}))


def test_two_workers_get_the_contracts_hashes_of_the_chat_tokens() -> None:
    expected = block_hashes(Tokenizer().encode(render_chat(MESSAGES)), 16)
    assert len(expected) >= 4
    assert hashes_for(*serving("a", "b")) == expected


def test_hashes_are_ready_at_once_only_where_no_worker_has_to_tokenize() -> None:
    payload = {"model": MODEL, "messages": MESSAGES}
    simulated = PrefixHasher(*serving("a", "b"), workers=None)
    assert simulated.hashes_now(MODEL, payload) == block_hashes(Tokenizer().encode(render_chat(MESSAGES)), 16)
    assert PrefixHasher(*serving("a"), workers=None).hashes_now(MODEL, payload) == []  # one worker: nothing to hash
    assert PrefixHasher(*serving("a", "b", engine="vllm"), workers=None).hashes_now(MODEL, payload) is None


def test_a_model_with_one_worker_is_not_hashed() -> None:
    assert hashes_for(*serving("a")) == []


def test_a_change_in_what_workers_report_applies_to_the_next_request() -> None:
    fleet, index = serving("a", "b")
    hasher = PrefixHasher(fleet, index, workers=None)
    payload = {"model": MODEL, "messages": MESSAGES}
    tokens = Tokenizer().encode(render_chat(MESSAGES))
    assert asyncio.run(hasher.hashes(MODEL, payload)) == block_hashes(tokens, 16)
    # The engines restart with another block size: the next request is hashed by it.
    for node_id in ("a", "b"):
        index.apply(node_id, "b2", nodeapi.KVBlocks(seq=1, block_size=32, stored=[]))
    assert asyncio.run(hasher.hashes(MODEL, payload)) == block_hashes(tokens, 32)
    # Nobody reports blocks any more: nothing to match, so nothing is hashed.
    index.forget("a")
    index.forget("b")
    assert asyncio.run(hasher.hashes(MODEL, payload)) == []
