"""Tool calling on the simulator, as the real ``openai`` client sees it over real HTTP."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from opod.contract.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "detailed": {"type": "boolean"},
                "note": {"type": "string"},
            },
            "required": ["city", "unit", "days", "detailed"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(handle) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "llamacpp", "ollama"])
def test_a_request_with_tools_calls_the_first_tool_with_arguments_that_fit_its_schema(sim, dialect) -> None:
    h = sim(dialect=dialect)
    r = client(h).chat.completions.create(model=_model(dialect), messages=ASK, tools=[WEATHER, TIME], max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "sim", "unit": "celsius", "days": 1, "detailed": True}
    assert r.usage.completion_tokens == len(Tokenizer().pieces(call.function.arguments))


def _model(dialect: str) -> str:
    return "sim-model:latest" if dialect == "ollama" else "sim-model"


def test_tool_choice_naming_a_function_calls_that_one(sim) -> None:
    h = sim()
    r = client(h).chat.completions.create(
        model="sim-model",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    [call] = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {"zone": "sim"})


def test_tool_choice_none_answers_text(sim) -> None:
    h = sim()
    r = client(h).chat.completions.create(
        model="sim-model", messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=5
    )
    assert r.choices[0].message.tool_calls in (None, [])
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")


def test_the_turn_after_a_tool_result_answers_text(sim) -> None:
    h = sim()
    c = client(h)
    first = c.chat.completions.create(model="sim-model", messages=ASK, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    follow = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    r = c.chat.completions.create(model="sim-model", messages=follow, tools=[WEATHER], max_tokens=8)
    assert r.choices[0].message.tool_calls in (None, [])
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")


def test_parallel_tool_calls_true_calls_every_tool(sim) -> None:
    h = sim()
    r = client(h).chat.completions.create(
        model="sim-model", messages=ASK, tools=[WEATHER, TIME], parallel_tool_calls=True
    )
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert len({c.id for c in calls}) == 2


def test_the_same_request_gets_the_same_call(sim) -> None:
    h = sim()
    c = client(h)
    a, b = (
        c.chat.completions.create(model="sim-model", messages=ASK, tools=[WEATHER]).choices[0].message.tool_calls[0]
        for _ in range(2)
    )
    assert a == b


@pytest.mark.parametrize("dialect", ["vllm", "llamacpp"])
def test_a_streamed_tool_call_names_the_call_then_streams_its_arguments(sim, dialect) -> None:
    h = sim(dialect=dialect)
    stream = client(h).chat.completions.create(
        model="sim-model",
        messages=ASK,
        tools=[WEATHER, TIME],
        parallel_tool_calls=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
    heads = [d for d in deltas if d.id]
    assert [(d.index, d.function.name, d.function.arguments) for d in heads] == [
        (0, "get_weather", ""),
        (1, "get_time", ""),
    ]
    assert all(d.type == "function" for d in heads)
    args: dict[int, str] = {}
    for d in deltas:
        args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
    assert json.loads(args[0])["unit"] == "celsius" and json.loads(args[1]) == {"zone": "sim"}
    assert len([d for d in deltas if not d.id]) > 2, "the arguments come in fragments"
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["tool_calls"]
    assert chunks[-1].usage.completion_tokens == len([d for d in deltas if not d.id])


def test_bad_tools_are_refused_naming_the_field(sim) -> None:
    h = sim()
    url = h.url + "/v1/chat/completions"
    cases = [
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ]
    for extra, param in cases:
        r = httpx.post(url, json={"model": "sim-model", "messages": ASK, **extra})
        assert r.status_code == 400, extra
        assert r.json()["error"]["param"] == param
