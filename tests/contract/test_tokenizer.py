"""The simulator's chat tokens: message by message, with each message's ids kept, exactly the ids of the whole rendered chat."""

from __future__ import annotations

import random

from opod.contract import tokenizer as tok
from opod.contract.tokenizer import BOS, Tokenizer, render_chat

# Pieces chosen to sit on the template's edges: specials, whitespace runs, punctuation, underscores, non-ASCII.
ALPHABET = [
    "a",
    "b",
    " ",
    "\n",
    "\t",
    "_",
    "<",
    "|",
    ">",
    "s",
    "/",
    "é",
    "1",
    "!",
    "<|user|>",
    "</s>",
    "<s>",
    "  ",
    "\r\n",
    "x_y",
]
ROLES = ["system", "user", "assistant", "tool", "", None, "Bot", "a|>\n"]


def random_chat(rnd: random.Random) -> list[dict]:
    return [
        {"role": rnd.choice(ROLES), "content": "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 12)))}
        for _ in range(rnd.randint(0, 4))
    ]


def test_chat_ids_match_the_whole_rendered_text_cold_and_warm() -> None:
    rnd = random.Random(7)
    chats = [(random_chat(rnd), rnd.random() < 0.7) for _ in range(2000)]
    cached = Tokenizer()
    for _ in range(2):  # the second pass reads every message from the cache
        for messages, generation_prompt in chats:
            expected = Tokenizer().encode(render_chat(messages, generation_prompt))
            assert cached.encode_chat(messages, generation_prompt) == expected, messages


def test_list_contents_and_a_returned_list_do_not_leak_into_the_cache() -> None:
    t = Tokenizer()
    messages = [{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]}]
    first = t.encode_chat(messages)
    first.append(999)  # a caller changing its list must not change the next answer
    assert t.encode_chat(messages) == Tokenizer().encode(render_chat(messages)) and t.encode_chat(messages)[0] == BOS


def test_kept_messages_stay_within_their_character_budget(monkeypatch) -> None:
    monkeypatch.setattr(tok, "MESSAGE_CACHE_CHARS", 2000)
    t = Tokenizer()
    for i in range(200):
        t.encode_chat([{"role": "user", "content": f"message number {i} " * 5}])
    assert 0 < t._message_chars <= 2000
    assert t._message_chars == sum(len(text) for text in t._messages)
    # A message too long to keep is still encoded right, and leaves the budget alone.
    long = [{"role": "system", "content": "word " * 1000}]
    before = t._message_chars
    assert t.encode_chat(long) == Tokenizer().encode(render_chat(long)) and t._message_chars == before
