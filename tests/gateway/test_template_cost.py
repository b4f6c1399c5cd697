"""A model's chat template cost, counted once in the background, bounds every chat a budget reserves for."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from opod.contract import nodeapi
from opod.contract.tokenizer import Tokenizer, render_chat
from opod.gateway.promptsize import prompt_size
from opod.gateway.templatecost import RELEARN_AFTER, TemplateCosts

DEFAULT_SYSTEM = " ".join(f"rule{i} of the house, kept by every assistant here." for i in range(40))


def with_default_system(messages: list[Mapping[str, Any]]) -> str:
    """A template that puts a long default system prompt in front of a chat that has none (as some models' do)."""
    if not messages or messages[0].get("role") != "system":
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}, *messages]
    return render_chat(messages)


class Worker:
    """A worker's ``/v1/tokenize`` for one template, on the simulator's tokenizer; counts its calls."""

    def __init__(self, template: Callable[[list[Mapping[str, Any]]], str]) -> None:
        self.template = template
        self.tokenizer = Tokenizer()
        self.calls = 0

    async def __call__(self, node_id: str, request: nodeapi.TokenizeRequest) -> list[int] | None:
        self.calls += 1
        messages = [{"role": m.role, "content": m.content} for m in request.messages or []]
        return self.tokenizer.encode(self.template(messages))

    def count(self, messages: list[dict[str, str]]) -> int:
        return len(self.tokenizer.encode(self.template(messages)))


def chats(seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    words = ["hello", "là-bas", "数据", "🙂", "a", "question?", "the", "long-winded", "x"]
    out = []
    for _ in range(200):
        out.append(
            [
                {
                    "role": rng.choice(["system", "user", "assistant"]) if i else rng.choice(["system", "user"]),
                    "content": " ".join(rng.choice(words) for _ in range(rng.randint(0, 30))),
                }
                for i in range(rng.randint(1, 6))
            ]
        )
    return out


@pytest.mark.parametrize("template", [render_chat, with_default_system], ids=["simulator", "default-system-prompt"])
async def test_a_template_learnt_once_bounds_every_chat_without_a_count_of_its_own(template) -> None:
    worker = Worker(template)
    costs = TemplateCosts(worker)
    assert costs.known("m", lambda: "n1") is None, "not known before a worker counted it"
    await asyncio.sleep(0.05)
    cost = costs.known("m", lambda: "n1")
    assert cost is not None
    learnt_with = worker.calls
    for messages in chats(7):
        bound = prompt_size({"messages": messages}, template=cost).bound()
        assert bound >= worker.count(messages), messages
        assert costs.known("m", lambda: "n1") == cost
    assert worker.calls == learnt_with, "no count on a chat's way once the template is known"
    if template is with_default_system:
        assert cost.base > len(DEFAULT_SYSTEM.split()), "the default system prompt is in the template's cost"
    await costs.close()


async def test_a_template_is_counted_again_in_the_background_after_a_while() -> None:
    now = [0.0]
    worker = Worker(render_chat)
    costs = TemplateCosts(worker, clock=lambda: now[0])
    costs.known("m", lambda: "n1")
    await asyncio.sleep(0.05)
    first = worker.calls
    now[0] += RELEARN_AFTER + 1
    assert costs.known("m", lambda: "n1") is not None, "the old cost serves while it is counted again"
    await asyncio.sleep(0.05)
    assert worker.calls == 2 * first
    await costs.close()


async def test_a_worker_that_cannot_count_leaves_the_template_unknown_and_is_asked_again_later() -> None:
    now, asked = [0.0], []

    async def down(node_id: str, request: nodeapi.TokenizeRequest) -> list[int] | None:
        asked.append(node_id)
        raise OSError("connection refused")

    costs = TemplateCosts(down, clock=lambda: now[0])
    assert costs.known("m", lambda: "n1") is None
    await asyncio.sleep(0.01)
    assert costs.known("m", lambda: "n1") is None and len(asked) == 1, "not asked again at once"
    now[0] += 31
    costs.known("m", lambda: "n2")
    await asyncio.sleep(0.01)
    assert asked == ["n1", "n2"], "asked again after a while"
    await costs.close()
