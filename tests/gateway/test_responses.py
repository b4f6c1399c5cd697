"""The Responses API translated onto chat completions: requests, whole answers and streams, as the ``openai`` package reads them.

The chat side is recorded answers (vLLM's and llama-server's shapes, as the simulator writes them);
the Responses side is checked with the ``openai`` package's own types and its client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response as OpenAIResponse
from openai.types.responses import ResponseStreamEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from opod.gateway.caller import InProcessCaller
from opod.gateway.responses import CHAT_PATH, chat_request, check_translated, responses_endpoint
from opod.gateway.responses_answer import response_object
from opod.gateway.validate import ModelTraits
from opod.http.errors import BadRequest

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)

CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
    },
}
TOOL_ANSWER = {
    "id": "chatcmpl-2",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38},
}


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-3",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


USAGE_CHUNK = {
    "id": "chatcmpl-3",
    "object": "chat.completion.chunk",
    "created": 1700000000,
    "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
}
TEXT_STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "Hel"}),
    _chunk({"content": "lo"}),
    _chunk({"content": "!"}, "stop"),
    USAGE_CHUNK,
]
LLAMA_TEXT_STREAM = [
    _chunk({"role": "assistant", "content": None}),
    _chunk({"content": "Hi"}),
    _chunk({}, "length"),
    USAGE_CHUNK,
]
TOOL_STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "Paris"}'}}]}),
    _chunk(
        {
            "tool_calls": [
                {"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": ""}}
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}, "tool_calls"),
    USAGE_CHUNK,
]


def sse(chunks: list[dict], *, done: bool = True) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n" if done else b""
    )


# --- the request ---------------------------------------------------------------------------------


def test_a_string_input_with_instructions_is_a_system_and_a_user_message() -> None:
    chat = chat_request(
        {
            "model": "m",
            "input": "Hi",
            "instructions": "Be brief.",
            "max_output_tokens": 20,
            "temperature": 0.2,
            "top_k": 5,
            "store": True,
            "metadata": {"a": "b"},
        }
    )
    assert chat == {
        "model": "m",
        "temperature": 0.2,
        "top_k": 5,
        "max_tokens": 20,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }


def test_input_items_become_the_conversation_with_tool_calls_and_their_outputs() -> None:
    chat = chat_request(
        {
            "model": "m",
            "stream": True,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Weather?"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAA", "detail": "low"},
                    ],
                },
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "21C"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 21C."}]},
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        }
    )
    assert chat["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA", "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21C"},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 21C."}]},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}},
    }
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"type": "file_search_call"}]}, "input[0].type"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"model": "m", "input": "x", "instructions": 3}, "instructions"),
    ],
)
def test_a_request_chat_cannot_answer_is_a_400_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(BadRequest) as err:
        chat_request(body)
    assert err.value.param == param


# --- whole answers -------------------------------------------------------------------------------


def test_a_chat_answer_is_a_completed_response_with_output_text_and_usage() -> None:
    out = OpenAIResponse.model_validate(
        response_object(CHAT_ANSWER, {"model": "m", "input": "Hi", "instructions": "Be brief."})
    )
    assert out.id.startswith("resp_") and out.object == "response" and out.status == "completed"
    assert out.output_text == "Hello there."
    assert out.output[0].type == "message" and out.output[0].id.startswith("msg_")
    assert out.instructions == "Be brief."
    assert out.usage is not None and (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (
        12,
        3,
        15,
    )
    assert out.usage.input_tokens_details.cached_tokens == 4


def test_tool_calls_are_function_call_items_and_a_cut_answer_is_incomplete() -> None:
    out = OpenAIResponse.model_validate(response_object(TOOL_ANSWER, {"model": "m", "input": "Weather?"}))
    [call] = out.output
    assert call.type == "function_call" and (call.call_id, call.name, call.arguments) == (
        "call_1",
        "get_weather",
        '{"city": "Paris"}',
    )
    cut = {**CHAT_ANSWER, "choices": [{**CHAT_ANSWER["choices"][0], "finish_reason": "length"}]}
    out = OpenAIResponse.model_validate(response_object(cut, {"model": "m", "input": "Hi", "max_output_tokens": 3}))
    assert (
        out.status == "incomplete"
        and out.incomplete_details is not None
        and out.incomplete_details.reason == "max_output_tokens"
    )


# --- the route, with the openai client -----------------------------------------------------------


class RecordedChat:
    """Stands in for the gateway's chat handler: records what it was sent, answers a recorded chat answer."""

    def __init__(self, answer: dict | bytes, status: int = 200, split: int = 0) -> None:
        self.answer = answer
        self.status = status
        self.split = split
        """Stream the answer in pieces of this many bytes (0: one piece per event)."""
        self.sent: list[tuple[str, dict]] = []
        self.closed = False

    async def __call__(self, request: Request, caller: InProcessCaller | None = None) -> Response:
        self.sent.append((request.url.path, json.loads(await request.body())))
        if isinstance(self.answer, bytes):
            return StreamingResponse(
                self._stream(self.answer), media_type="text/event-stream", headers={"X-Opod-Worker": "w1"}
            )
        return Response(
            json.dumps(self.answer),
            status_code=self.status,
            media_type="application/json",
            headers={"X-Opod-Worker": "w1"},
        )

    async def _stream(self, data: bytes) -> AsyncIterator[bytes]:
        try:
            if self.split:
                for i in range(0, len(data), self.split):
                    yield data[i : i + self.split]
            else:
                for event in data.split(b"\n\n"):
                    if event:
                        yield event + b"\n\n"
        finally:
            self.closed = True


def client(chat: RecordedChat) -> openai.AsyncOpenAI:
    app = Starlette(routes=[Route("/v1/responses", responses_endpoint(chat), methods=["POST"])])
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    return openai.AsyncOpenAI(base_url="http://gw/v1", api_key="k", http_client=http, max_retries=0)


async def test_responses_create_is_answered_by_the_chat_route() -> None:
    chat = RecordedChat(CHAT_ANSWER)
    raw = await client(chat).responses.with_raw_response.create(
        model="m", input="Hi", instructions="Be brief.", max_output_tokens=20
    )
    out = raw.parse()
    assert out.output_text == "Hello there." and out.status == "completed" and out.usage.output_tokens == 3
    assert raw.headers["x-opod-worker"] == "w1"
    [(path, sent)] = chat.sent
    assert path == CHAT_PATH
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."} and sent["max_tokens"] == 20


async def test_a_chat_error_reaches_the_client_as_it_was() -> None:
    chat = RecordedChat(
        {
            "error": {
                "message": "too long",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        400,
    )
    with pytest.raises(openai.BadRequestError) as err:
        await client(chat).responses.create(model="m", input="Hi")
    assert err.value.code == "context_length_exceeded"


async def test_a_bad_responses_request_never_reaches_chat() -> None:
    chat = RecordedChat(CHAT_ANSWER)
    with pytest.raises(openai.BadRequestError) as err:
        await client(chat).responses.create(model="m", input="Hi", previous_response_id="resp_x")
    assert err.value.param == "previous_response_id" and chat.sent == []


@pytest.mark.parametrize("split", [0, 7])
async def test_a_streamed_answer_is_the_responses_event_stream(split: int) -> None:
    chat = RecordedChat(sse(TEXT_STREAM), split=split)
    events = [e async for e in await client(chat).responses.create(model="m", input="Hi", stream=True)]
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello!"
    done = events[-1].response
    assert done.status == "completed" and done.output_text == "Hello!" and done.usage.output_tokens == 3
    assert chat.sent[0][1]["stream_options"] == {"include_usage": True}
    for event in events:
        EVENT.validate_python(event.model_dump())


async def test_a_streamed_answer_cut_at_max_output_tokens_ends_incomplete() -> None:
    chat = RecordedChat(sse(LLAMA_TEXT_STREAM))
    events = [
        e async for e in await client(chat).responses.create(model="m", input="Hi", stream=True, max_output_tokens=1)
    ]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


async def test_streamed_tool_calls_are_function_call_items_with_argument_deltas() -> None:
    chat = RecordedChat(sse(TOOL_STREAM))
    events = [
        e
        async for e in await client(chat).responses.create(
            model="m",
            input="Weather?",
            stream=True,
            tools=[{"type": "function", "name": "get_weather", "parameters": {}}],
        )
    ]
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(i.type, i.name, i.call_id) for i in added] == [
        ("function_call", "get_weather", "call_a"),
        ("function_call", "get_time", "call_b"),
    ]
    deltas = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.output_index == 0
    )
    assert deltas == '{"city": "Paris"}'
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [(e.output_index, e.arguments) for e in done] == [(0, '{"city": "Paris"}'), (1, "{}")]
    final = events[-1].response
    assert [o.arguments for o in final.output] == ['{"city": "Paris"}', "{}"]
    assert chat.sent[0][1]["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


async def test_a_chat_stream_that_breaks_off_ends_with_an_error_and_a_failed_response() -> None:
    cut = (
        sse(TEXT_STREAM[:2], done=False)
        + b"data: "
        + json.dumps({"error": {"message": "cut off", "type": "server_error", "code": "upstream_interrupted"}}).encode()
        + b"\n\n"
    )
    chat = RecordedChat(cut)
    events = [e async for e in await client(chat).responses.create(model="m", input="Hi", stream=True)]
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "upstream_interrupted" and events[-1].response.status == "failed"
    assert chat.closed


def test_the_chat_rules_on_a_translated_request_name_the_responses_fields() -> None:
    small = ModelTraits("m", context=100)
    with pytest.raises(BadRequest) as refused:
        check_translated(chat_request({"model": "m", "input": "Hi", "max_output_tokens": 500}), small)
    assert refused.value.param == "max_output_tokens" and refused.value.message.startswith("max_output_tokens=500 ")
    with pytest.raises(BadRequest) as refused:
        check_translated(chat_request({"model": "m", "input": "word " * 5000}), small)
    assert refused.value.param == "input" and "and input comes to" in refused.value.message
    for chat_name, own in (("max_tokens", "max_output_tokens"), ("messages", "input"), ("response_format", "text")):
        with pytest.raises(BadRequest) as refused:
            chat_request({"model": "m", "input": "Hi", chat_name: 5})
        assert refused.value.param == chat_name and own in refused.value.message
