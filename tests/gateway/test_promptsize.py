"""The bounds a budget reserves: never less than what an engine counts, for every shape of prompt OpenAI has."""

from __future__ import annotations

import json

from opod.gateway.promptsize import (
    MESSAGE_TOKENS,
    SPECIAL_TOKENS,
    TEMPLATE_TOKENS,
    completion_bound,
    default_limit,
    prompt_size,
)


def test_a_text_is_bounded_by_its_bytes_and_each_prompt_of_a_list_counts() -> None:
    one = prompt_size({"prompt": "héllo"})
    assert one.bound() == 6 + SPECIAL_TOKENS and one.prompts == 1
    listed = prompt_size({"prompt": ["héllo", "abc", ""]})
    assert listed.bound() == (6 + 3 + 0) + 3 * SPECIAL_TOKENS and listed.prompts == 3
    assert prompt_size({"prompt": [1, 2, 3]}).bound() == 3 + SPECIAL_TOKENS
    assert prompt_size({"prompt": [[1, 2], [3, 4, 5]]}).bound() == 5 + 2 * SPECIAL_TOKENS
    assert prompt_size({"prompt": "def f(", "suffix": "return x"}).bound() == 6 + 8 + SPECIAL_TOKENS


def test_inputs_to_embed_and_documents_to_rerank_each_count() -> None:
    assert prompt_size({"input": ["a b", "cd"]}).bound() == 5 + 2 * SPECIAL_TOKENS
    assert prompt_size({"input": [[7, 8, 9]]}).bound() == 3 + SPECIAL_TOKENS
    rerank = prompt_size({"query": "cats", "documents": ["a cat", {"text": "dogs"}]})
    assert rerank.bound() == (4 + 5) + (4 + 4) + 2 * SPECIAL_TOKENS


def test_a_lone_surrogate_is_sized_rather_than_refused() -> None:
    assert prompt_size({"prompt": "\ud800"}).bound() == 3 + SPECIAL_TOKENS


def test_a_chat_is_its_workers_count_with_tools_on_top_or_a_bound_with_the_templates_allowance() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]
    counted = prompt_size({"messages": messages, "tools": tools}, counted=31)
    tools_bytes = len('[{"type": "function", "function": {"name": "f", "parameters": {}}}]')
    assert counted.bound() == 31 + tools_bytes and counted.prompts == 1
    uncounted = prompt_size({"messages": messages})
    assert uncounted.bound() == (4 + 2) + (9 + 2) + TEMPLATE_TOKENS + 2 * MESSAGE_TOKENS


def test_a_chats_names_calls_and_text_beyond_ascii_count_as_their_bytes() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [
        {"role": "user", "name": "zoë", "content": "héllo"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        "not a message",
    ]
    calls_bytes = len(json.dumps(calls))
    chat = prompt_size({"messages": messages})
    assert chat.bound() == (4 + 4 + 6) + (9 + calls_bytes) + TEMPLATE_TOKENS + 3 * MESSAGE_TOKENS
    assert prompt_size({"messages": messages}, counted=20).bound() == 20 + calls_bytes


def test_the_completion_is_each_choice_of_each_prompt() -> None:
    prompt = prompt_size({"prompt": ["a", "b", "c"]})
    assert completion_bound({"prompt": ["a", "b", "c"], "max_tokens": 6, "n": 2}, 8192, prompt, 4096) == 36
    chat = prompt_size({"messages": [{"role": "user", "content": "hi"}]})
    assert completion_bound({"max_completion_tokens": 7, "max_tokens": 50}, None, chat, 4096) == 7
    assert completion_bound({}, 8192, chat, 4096) == 8192  # no limit: the context holds it
    assert completion_bound({}, None, chat, 4096) == 4096


def test_a_request_without_a_limit_gets_the_settings_or_openais_for_completions_unless_the_context_holds_less() -> None:
    chat = prompt_size({"messages": [{"role": "user", "content": "hi"}]})
    assert default_limit("/v1/chat/completions", 4096, 8192, chat) == 4096
    assert default_limit("/v1/chat/completions", 4096, None, chat) == 4096
    assert default_limit("/v1/completions", 4096, 8192, prompt_size({"prompt": "x"})) == 16
    assert default_limit("/v1/completions", 8, 8192, prompt_size({"prompt": "x"})) == 8
    assert default_limit("/v1/chat/completions", 4096, 4096, chat) is None
