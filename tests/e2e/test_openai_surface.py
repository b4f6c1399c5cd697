"""The OpenAI surface through ``opod up``, as the real ``openai`` package calls it: tool calls, ``n``, the Responses API,
and the context a model's catalog entry states.

First on the simulator (fast, deterministic: it calls the first tool with arguments that fit its schema), then on
the real llama-server with SmolLM2-135M-Instruct, started with ``--jinja`` (its own chat template, which has no
tool syntax) and four slots of the 8,192 tokens its catalog entry states.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import yaml

from opod.catalog import bundled_dir
from tests.support.opod_process import Leader, opod_cli, usage_rows, wait_until

SIM_MODEL = "sim-chat"
CHAT = "smollm2-135m-instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]


def _catalog_entry(home: Path, model_id: str, capabilities: list[str]) -> None:
    """A simulated model in the leader's own catalog, stating what it can do."""
    body = yaml.safe_load((bundled_dir() / "qwen2.5-0.5b-gguf.yaml").read_text())
    body.update(
        id=model_id, display_name=model_id, source={"type": "file", "path": "/simulated"}, capabilities=capabilities
    )
    (home / "catalog").mkdir(parents=True, exist_ok=True)
    (home / "catalog" / f"{model_id}.yaml").write_text(yaml.safe_dump(body))


@pytest.fixture(scope="module")
def sim_up(tmp_path_factory: pytest.TempPathFactory):
    home: Path = tmp_path_factory.mktemp("surface") / "home"
    _catalog_entry(home, SIM_MODEL, ["chat", "tools"])
    leader = Leader(home, extra=["--no-default-models", "--engine", "sim"])
    added = opod_cli(leader, "model", "add", SIM_MODEL, "--engine", "sim")
    assert added.returncode == 0, added.stderr
    leader.wait_served(SIM_MODEL, timeout=90)
    yield leader
    leader.process.stop()


@pytest.fixture(scope="module")
def sim_client(sim_up: Leader) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim_up.url + "/v1", api_key=sim_up.key, max_retries=0, timeout=30)


# --- the simulator -------------------------------------------------------------------------------


def test_a_tool_call_comes_back_as_message_tool_calls(sim_client: openai.OpenAI) -> None:
    r = sim_client.chat.completions.create(model=SIM_MODEL, messages=ASK, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "sim"}
    assert r.usage.completion_tokens > 0


def test_a_streamed_tool_call_arrives_as_tool_call_deltas(sim_client: openai.OpenAI) -> None:
    stream = sim_client.chat.completions.create(
        model=SIM_MODEL, messages=ASK, tools=[WEATHER], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "sim"}
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == [
        "tool_calls"
    ]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_the_turn_after_the_tool_result_is_text(sim_client: openai.OpenAI) -> None:
    first = sim_client.chat.completions.create(model=SIM_MODEL, messages=ASK, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    r = sim_client.chat.completions.create(
        model=SIM_MODEL,
        tools=[WEATHER],
        max_tokens=8,
        messages=[
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
        ],
    )
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


def test_n_choices_through_the_gateway(sim_client: openai.OpenAI) -> None:
    r = sim_client.chat.completions.create(
        model=SIM_MODEL, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=6
    )
    assert [c.index for c in r.choices] == [0, 1]


def _row(leader: Leader, request_id: str):
    return next((e.data for e in usage_rows(leader) if e.data.request_id == request_id), None)


def test_responses_create_answers_output_text_with_usage(sim_up: Leader, sim_client: openai.OpenAI) -> None:
    raw = sim_client.responses.with_raw_response.create(
        model=SIM_MODEL,
        input="Say hello.",
        instructions="Be brief.",
        max_output_tokens=8,
        extra_headers={"X-Request-Id": "resp-usage-1"},
    )
    r = raw.parse()
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage is not None and 0 < r.usage.output_tokens <= 8 and r.usage.input_tokens > 0
    row = wait_until(lambda: _row(sim_up, "resp-usage-1"), 10, "the usage row")
    assert (row.prompt_tokens, row.completion_tokens, row.outcome) == (
        r.usage.input_tokens,
        r.usage.output_tokens,
        "ok",
    )


def test_responses_create_streamed_ends_with_the_whole_response(sim_client: openai.OpenAI) -> None:
    events = list(
        sim_client.responses.create(
            model=SIM_MODEL, input=[{"role": "user", "content": "Say hello."}], max_output_tokens=8, stream=True
        )
    )
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens > 0
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_responses_tool_call_is_a_function_call_item(sim_client: openai.OpenAI) -> None:
    r = sim_client.responses.create(
        model=SIM_MODEL, input="Weather in Paris?", tools=[{"type": "function", **WEATHER["function"]}]
    )
    [item] = r.output
    assert item.type == "function_call" and item.name == "get_weather" and json.loads(item.arguments) == {"city": "sim"}


# --- the real llama-server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_up(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("surface-real") / "home"
    leader = Leader(home)
    leader.wait_served(CHAT, timeout=150)
    yield leader
    if leader.process.proc.poll() is None:
        leader.process.stop()


@pytest.fixture(scope="module")
def real_client(real_up: Leader) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_up.url + "/v1", api_key=real_up.key, max_retries=0, timeout=120)


@pytest.mark.engine
def test_tools_for_a_model_whose_template_has_none_are_a_400_naming_tools(real_client: openai.OpenAI) -> None:
    """SmolLM2's chat template has no tool syntax (llama-server's /props says ``supports_tools: false``) and
    llama-server would answer text, silently; its catalog entry lacks ``tools``, so the gateway says so."""
    with pytest.raises(openai.BadRequestError) as err:
        real_client.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER], max_tokens=8)
    assert err.value.param == "tools"


@pytest.mark.engine
def test_a_prompt_longer_than_llama_cpps_4096_default_fits_the_8192_the_catalog_states(
    real_up: Leader, real_client: openai.OpenAI
) -> None:
    listed = {m.id: m for m in real_client.models.list().data}
    stated = getattr(listed[CHAT], "max_model_len", None)
    assert stated in (None, 8192)
    # Past llama-server's 4096 default, and short enough that a CPU without AVX-512 reads it in a minute.
    long_prompt = "Count the words: " + " ".join(["apple"] * 4500)
    r = real_client.with_options(timeout=300).chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": long_prompt}], max_tokens=1, temperature=0
    )
    assert r.usage.prompt_tokens > 4500
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.engine
def test_responses_create_on_llama_server(real_client: openai.OpenAI) -> None:
    r = real_client.responses.create(model=CHAT, input="Say hello.", max_output_tokens=8)
    assert r.output_text and r.usage.output_tokens > 0
