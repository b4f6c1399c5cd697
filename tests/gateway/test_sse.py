"""Streams read as engines write them: llama-server's usage per prompt, vLLM's whole, and a text completion's
stream put together as OpenAI's whole answer."""

from __future__ import annotations

import json

import pytest

from opod.gateway.sse import CompletionAssembler, SSEFilter, tokens_in
from opod.http.upstream import UpstreamError


def event(**chunk: object) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"  # as engines write it


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# llama-server's answer to two prompts in one stream: each prompt's last chunk carries that prompt's usage.
LLAMA_LIST = (
    b"data: null\n\n"
    + event(id="c1", created=5, model="m", choices=[{"text": " six", "index": 1, "finish_reason": None}])
    + event(id="c1", created=5, model="m", choices=[{"text": ",", "index": 0, "finish_reason": None}])
    + event(id="c1", choices=[{"text": "", "index": 1, "finish_reason": "length"}], usage=usage(5, 1))
    + event(id="c1", choices=[{"text": " I", "index": 0, "finish_reason": None}])
    + event(id="c1", choices=[{"text": "", "index": 0, "finish_reason": "length"}], usage=usage(2, 2))
    + b"data: [DONE]\n\n"
)


def test_a_list_streamed_by_llama_server_counts_every_prompts_usage_and_drops_its_null_event() -> None:
    sse = SSEFilter(strip_usage=True)
    out = b"".join(sse.feed(LLAMA_LIST[i : i + 7]) for i in range(0, len(LLAMA_LIST), 7)) + sse.flush()
    assert sse.usage == usage(7, 3)
    assert b"data: null" not in out and out.count(b"data: {") == 5  # the usage rides on chunks with choices: kept


def test_a_usage_chunk_without_choices_is_the_whole_requests_and_continuous_usage_counts_once() -> None:
    sse = SSEFilter(strip_usage=True)
    stream = event(choices=[{"index": 0, "delta": {"content": "a"}}], usage=usage(9, 1)) + event(
        choices=[{"index": 0, "delta": {"content": "b"}}], usage=usage(9, 2)
    )
    sse.feed(stream)
    assert sse.usage == usage(9, 2)
    out = sse.feed(event(choices=[], usage=usage(9, 2)) + b"data: [DONE]\n\n")
    assert sse.usage == usage(9, 2) and b"usage" not in out


def test_text_content_and_reasoning_deltas_each_count_one_token() -> None:
    chat = event(choices=[{"delta": {"content": "Hi"}}]) + event(choices=[{"delta": {"content": ""}}])
    thinking = event(choices=[{"delta": {"reasoning_content": "hmm"}}])
    assert (tokens_in(chat), tokens_in(thinking), tokens_in(LLAMA_LIST)) == (1, 1, 3)


def test_a_text_completions_stream_is_put_together_as_the_whole_answer() -> None:
    assembler = CompletionAssembler()
    for i in range(0, len(LLAMA_LIST), 11):
        assembler.feed(LLAMA_LIST[i : i + 11])
    assembler.feed(b"\n\n")
    answer = json.loads(assembler.answer())
    assert answer == {
        "id": "c1",
        "object": "text_completion",
        "created": 5,
        "model": "m",
        "choices": [
            {"index": 0, "text": ", I", "logprobs": None, "finish_reason": "length"},
            {"index": 1, "text": " six", "logprobs": None, "finish_reason": "length"},
        ],
        "usage": usage(7, 3),
    }
    assert assembler.tokens == 3


def test_logprobs_are_joined_and_an_error_event_breaks_the_answer_off() -> None:
    assembler = CompletionAssembler()
    for text, lp in (("a", -0.5), ("b", -1.0)):
        logprobs = {"tokens": [text], "token_logprobs": [lp], "top_logprobs": None, "text_offset": [0]}
        assembler.feed(event(choices=[{"index": 0, "text": text, "logprobs": logprobs}]))
    [choice] = json.loads(assembler.answer())["choices"]
    assert choice["text"] == "ab" and choice["logprobs"]["tokens"] == ["a", "b"]
    assert choice["logprobs"]["token_logprobs"] == [-0.5, -1.0]
    with pytest.raises(UpstreamError):
        assembler.feed(event(error={"message": "out of memory"}))


def test_whole_events_pass_as_they_are_and_a_usage_chunk_cut_in_two_is_still_dropped() -> None:
    sse = SSEFilter(strip_usage=True)
    deltas = [event(choices=[{"index": 0, "delta": {"content": word}}]) for word in ("a", "b")]
    assert [sse.feed(piece) for piece in deltas] == deltas
    usage_chunk = event(choices=[], usage=usage(4, 2))
    out = sse.feed(usage_chunk[:20]) + sse.feed(usage_chunk[20:] + b"data: [DONE]\n\n") + sse.flush()
    assert out == b"data: [DONE]\n\n" and sse.usage == usage(4, 2)


def test_a_piece_with_several_kinds_of_delta_counts_each() -> None:
    piece = event(choices=[{"delta": {"reasoning_content": "so"}}]) + event(choices=[{"delta": {"content": "Hi"}}])
    assert tokens_in(piece + event(choices=[{"text": "x"}]) + event(choices=[{"text": ""}])) == 3
