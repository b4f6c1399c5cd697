"""The /v1 request rules: each bad request is refused with a 400 that names the field, before any engine sees it."""

from __future__ import annotations

import time

import pytest

from opod.gateway.validate import (
    ModelTraits,
    check_chat,
    check_completion,
    check_content_type,
    check_embeddings,
    check_rerank,
    require_model,
)
from opod.http.errors import BadRequest

CHAT_MODEL = ModelTraits(
    "smollm2-135m-instruct", context=8192, capabilities=frozenset({"chat"}), engines=frozenset({"llamacpp"})
)
VISION_MODEL = ModelTraits(
    "gemma4-e2b",
    context=8192,
    capabilities=frozenset({"chat", "vision", "audio", "tools"}),
    engines=frozenset({"vllm"}),
)
UNKNOWN = ModelTraits("served-somewhere")
EMBED_MODEL = ModelTraits("all-minilm-l6-v2", context=512, capabilities=frozenset({"embedding"}))
HELLO = [{"role": "user", "content": "Hello"}]


def refusal(check, payload: dict, model: ModelTraits = CHAT_MODEL) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        check(payload, model)
    assert caught.value.status == 400 and caught.value.type == "invalid_request_error"
    return caught.value


def chat_refusal(model: ModelTraits = CHAT_MODEL, **fields) -> BadRequest:
    return refusal(check_chat, {"model": model.id, "messages": HELLO, **fields}, model)


# --- the body and the model ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b"application/json", b"application/json; charset=utf-8", b"Application/JSON", None, b"application/vnd.api+json"],
)
def test_a_json_content_type_or_none_is_accepted(value: bytes | None) -> None:
    check_content_type(value)


@pytest.mark.parametrize(
    "value", [b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x"]
)
def test_a_body_sent_as_another_type_is_refused_naming_the_header_and_what_to_send(value: bytes) -> None:
    with pytest.raises(BadRequest) as caught:
        check_content_type(value)
    assert caught.value.param == "Content-Type" and "application/json" in caught.value.message


@pytest.mark.parametrize("payload", [{}, {"model": None}, {"model": ""}])
def test_a_missing_null_or_empty_model_is_refused(payload: dict) -> None:
    error = refusal(lambda p, _: require_model(p), payload)
    assert error.param == "model" and "required" in error.message


def test_a_model_that_is_not_a_string_is_refused() -> None:
    assert refusal(lambda p, _: require_model(p), {"model": 3}).param == "model"


def test_auto_and_a_name_are_models() -> None:
    assert require_model({"model": "auto"}) == "auto"
    assert require_model({"model": "x"}) == "x"


# --- messages -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (None, "messages"),
        ([], "messages"),
        ("hi", "messages"),
        (["hi"], "messages[0]"),
        ([{"content": "hi"}], "messages[0].role"),
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"role": "user", "content": 7}], "messages[0].content"),
        (
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text"}]}],
            "messages[1].content[0].text",
        ),
        ([{"role": "user", "content": [{"type": "picture", "url": "x"}]}], "messages[0].content[0].type"),
        ([{"role": "user", "content": ["hi"]}], "messages[0].content[0].type"),
        ([{"role": "assistant"}], "messages[0].content"),
        ([{"role": "tool", "content": "42"}], "messages[0].tool_call_id"),
        ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
        (
            [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content[0].type",
        ),
    ],
)
def test_malformed_messages_are_refused_naming_the_field(messages, param: str) -> None:
    error = refusal(check_chat, {"model": "m", "messages": messages} if messages is not None else {"model": "m"})
    assert error.param == param, error.message
    assert param.split(".")[-1].split("[")[0] in error.message


def test_well_formed_conversations_pass() -> None:
    conversation = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}, {"type": "refusal", "refusal": "no"}]},
        {"role": "function", "name": "weather", "content": None},
    ]
    assert check_chat({"model": "m", "messages": conversation}, VISION_MODEL) is False


def test_image_or_audio_parts_go_only_to_a_model_that_takes_them() -> None:
    image = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
    ]
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]
    for messages, capability in ((image, "vision"), (audio, "audio")):
        error = chat_refusal(messages=messages)
        assert (
            error.param == "messages[0].content[0].type"
            and capability in error.message
            and CHAT_MODEL.id in error.message
        )
        assert check_chat({"model": "m", "messages": messages}, VISION_MODEL) is False
        assert (
            check_chat({"model": "m", "messages": messages}, UNKNOWN) is False
        )  # no capabilities stated: the engine decides


def test_an_image_part_without_its_image_is_refused() -> None:
    error = refusal(
        check_chat, {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, VISION_MODEL
    )
    assert error.param == "messages[0].content[0].image_url"


# --- samplers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("max_tokens", 1.5),
        ("max_tokens", "8"),
        ("max_tokens", True),
        ("max_completion_tokens", 0),
        ("max_tokens", 9000),
        ("temperature", -3),
        ("temperature", 2.5),
        ("temperature", "hot"),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("presence_penalty", 3),
        ("frequency_penalty", -2.5),
        ("n", 0),
        ("n", 2.0),
        ("n", 1000),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", 5),
        ("stop", [1]),
        ("stream", "yes"),
        ("stream_options", "usage"),
        ("top_logprobs", 21),
        ("logprobs", 1),
        ("response_format", {"type": "xml"}),
        ("response_format", "json"),
    ],
)
def test_sampler_values_out_of_range_are_refused_naming_the_field(field: str, value: object) -> None:
    error = chat_refusal(**{field: value})
    assert error.param == field and field in error.message


def test_a_request_with_several_faults_is_refused_for_the_same_one_whatever_order_it_names_them() -> None:
    faults = {"response_format": "json", "stop": 5, "temperature": 9, "max_tokens": 0}
    assert chat_refusal(**faults).param == "max_tokens"
    assert chat_refusal(**dict(reversed(faults.items()))).param == "max_tokens"
    bad_message = [{"role": "user", "content": "x"}, {"role": "user", "content": 5}]
    assert refusal(check_chat, {"max_tokens": 0, "messages": bad_message}).param == "messages[1].content"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 1),
        ("max_completion_tokens", 8192),
        ("temperature", 0),
        ("temperature", 2),
        ("temperature", 0.7),
        ("top_p", 1),
        ("presence_penalty", -2),
        ("frequency_penalty", 2),
        ("n", 1),
        ("stop", "\n"),
        ("stop", ["a", "b", "c", "d"]),
        ("stream", True),
        ("stream", None),
        ("stream_options", {"include_usage": True}),
        ("response_format", {"type": "json_object"}),
    ],
)
def test_sampler_values_in_range_pass(field: str, value: object) -> None:
    assert check_chat({"model": "m", "messages": HELLO, field: value}, CHAT_MODEL) is False


def test_several_choices_only_where_the_serving_engine_gives_them() -> None:
    error = chat_refusal(n=2)
    assert error.param == "n" and "n=2" in error.message and "llamacpp" in error.message
    for engines in (("vllm",), ("sglang",), ("sim",), ()):
        model = ModelTraits("m", engines=frozenset(engines))
        assert check_chat({"model": "m", "messages": HELLO, "n": 3}, model) is False
    assert refusal(check_completion, {"model": "m", "prompt": "x", "best_of": 2}).param == "best_of"


# --- tools -----------------------------------------------------------------------------------------


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_tools_go_only_to_a_model_that_calls_them() -> None:
    error = chat_refusal(tools=[WEATHER])
    assert error.param == "tools" and "tools" in error.message and CHAT_MODEL.id in error.message
    assert chat_refusal(functions=[{"name": "weather"}]).param == "functions"
    assert (
        check_chat(
            {"model": "m", "messages": HELLO, "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": False},
            VISION_MODEL,
        )
        is False
    )
    assert check_chat({"model": "m", "messages": HELLO, "tools": [WEATHER]}, UNKNOWN) is False


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": {"weather": {}}}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "function"}}, "tool_choice"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_malformed_tools_are_refused_naming_the_field(fields: dict, param: str) -> None:
    assert chat_refusal(VISION_MODEL, **fields).param == param


# --- the context -------------------------------------------------------------------------------------


def test_a_prompt_certainly_over_the_context_is_refused_with_the_limit_at_once() -> None:
    huge = "word " * (4 << 20)  # 20 MiB
    started = time.perf_counter()
    error = chat_refusal(messages=[{"role": "user", "content": huge}])
    assert time.perf_counter() - started < 0.5
    assert error.code == "context_length_exceeded" and error.param == "messages" and "8192" in error.message


def test_many_words_over_the_context_are_refused_though_short_in_characters() -> None:
    error = chat_refusal(messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "a " * 9000}])
    assert error.code == "context_length_exceeded" and "at least 9002 tokens" in error.message


def test_a_long_prompt_that_may_fit_passes_to_the_engine() -> None:
    assert check_chat({"model": "m", "messages": [{"role": "user", "content": "longword" * 8000}]}, CHAT_MODEL) is False
    assert check_chat({"model": "m", "messages": [{"role": "user", "content": "a " * 9000}]}, UNKNOWN) is False


# --- completions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "param"), [(None, "prompt"), (5, "prompt"), ([], "prompt"), ([1, "a"], "prompt"), ([[]], "prompt")]
)
def test_a_completion_needs_a_prompt_of_openai_shapes(prompt: object, param: str) -> None:
    payload = {"model": "m"} if prompt is None else {"model": "m", "prompt": prompt}
    assert refusal(check_completion, payload).param == param


def test_completion_prompts_of_every_shape_pass_and_token_ids_are_counted_exactly() -> None:
    for prompt in ("Once", "", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        assert check_completion({"model": "m", "prompt": prompt, "max_tokens": 4}, CHAT_MODEL) is False
    error = refusal(check_completion, {"model": "m", "prompt": list(range(8193))})
    assert error.code == "context_length_exceeded" and "8193 tokens" in error.message
    assert refusal(check_completion, {"model": "m", "prompt": "x", "temperature": 9}).param == "temperature"


# --- embeddings --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", [], [""], ["a", 1], 5, [[]], {"text": "a"}])
def test_embeddings_need_input_of_openai_shapes(value: object) -> None:
    payload = {"model": "e"} if value is None else {"model": "e", "input": value}
    assert refusal(check_embeddings, payload, EMBED_MODEL).param == "input"


def test_embeddings_inputs_of_every_shape_pass() -> None:
    for value in ("hi", ["a", "b"], [1, 2], [[1, 2], [3]]):
        assert check_embeddings({"model": "e", "input": value, "encoding_format": "float"}, EMBED_MODEL) is False
    assert (
        refusal(check_embeddings, {"model": "e", "input": "x", "encoding_format": "int8"}, EMBED_MODEL).param
        == "encoding_format"
    )
    assert refusal(check_embeddings, {"model": "e", "input": "x", "dimensions": 0}, EMBED_MODEL).param == "dimensions"


def test_an_embeddings_input_over_the_context_is_refused_with_the_limit() -> None:
    error = refusal(check_embeddings, {"model": "e", "input": ["short", "hello " * 600]}, EMBED_MODEL)
    assert (
        error.code == "context_length_exceeded" and "512" in error.message and "truncate_prompt_tokens" in error.message
    )
    error = refusal(check_embeddings, {"model": "e", "input": list(range(600))}, EMBED_MODEL)
    assert error.code == "context_length_exceeded" and "600 tokens" in error.message


def test_an_embeddings_input_is_cut_when_the_request_asks() -> None:
    payload = {"model": "e", "input": [list(range(600)), [1, 2]], "truncate_prompt_tokens": 100}
    assert check_embeddings(payload, EMBED_MODEL) is True
    assert [len(v) for v in payload["input"]] == [100, 2]
    payload = {"model": "e", "input": list(range(600)), "truncate_prompt_tokens": -1}
    assert check_embeddings(payload, EMBED_MODEL) is True and len(payload["input"]) == 512
    assert (
        check_embeddings({"model": "e", "input": "hello " * 600, "truncate_prompt_tokens": 512}, EMBED_MODEL) is False
    )
    error = refusal(check_embeddings, {"model": "e", "input": "x", "truncate_prompt_tokens": 0}, EMBED_MODEL)
    assert error.param == "truncate_prompt_tokens"


# --- rerank ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"documents": ["a"]}, "query"),
        ({"query": "", "documents": ["a"]}, "query"),
        ({"query": "q"}, "documents"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", 3]}, "documents[1]"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ],
)
def test_rerank_needs_a_query_and_documents(fields: dict, param: str) -> None:
    assert refusal(check_rerank, {"model": "r", **fields}, UNKNOWN).param == param


def test_rerank_documents_as_texts_or_objects_pass() -> None:
    assert check_rerank({"model": "r", "query": "q", "documents": ["a", {"text": "b"}], "top_n": 1}, UNKNOWN) is False


# --- cost -----------------------------------------------------------------------------------------------


def test_a_typical_chat_is_checked_in_microseconds() -> None:
    payload = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "What is the capital of France? " * 10},
        ],
        "max_tokens": 64,
        "temperature": 0.7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rounds = 2000
    started = time.thread_time()  # CPU time: the suite's other processes share the cores
    for _ in range(rounds):
        check_chat(payload, CHAT_MODEL)
    per_call = (time.thread_time() - started) / rounds
    assert per_call < 50e-6, f"{per_call * 1e6:.1f} µs per check"


@pytest.mark.parametrize(
    ("bias", "param"),
    [
        ([1, 2], "logit_bias"),
        ({"hello": 1}, "logit_bias.hello"),
        ({"1.5": 1}, "logit_bias.1.5"),
        ({"99999999999": 1}, "logit_bias.99999999999"),
        ({"42": 101}, "logit_bias.42"),
        ({"42": "-5"}, "logit_bias.42"),
    ],
)
def test_logit_bias_keys_are_token_ids_and_values_from_minus_100_to_100(bias: object, param: str) -> None:
    assert chat_refusal(logit_bias=bias).param == param
    assert (
        check_chat({"model": "m", "messages": HELLO, "logit_bias": {"42": -100, "7": 100, "9": 0.5}}, CHAT_MODEL)
        is False
    )


MATRYOSHKA = ModelTraits("nomic", context=8192, capabilities=frozenset({"embedding"}), dimensions=768, matryoshka=True)


def test_dimensions_are_honoured_up_to_a_matryoshka_models_size_and_refused_for_any_other_model() -> None:
    sized = ModelTraits("all-minilm-l6-v2", context=512, capabilities=frozenset({"embedding"}), dimensions=384)
    refused = refusal(check_embeddings, {"model": "e", "input": "x", "dimensions": 8}, sized)
    assert refused.param == "dimensions" and "Matryoshka" in refused.message and "384 values" in refused.message
    assert check_embeddings({"model": "e", "input": "x", "dimensions": 384}, sized) is False, "its own size"
    assert refusal(check_embeddings, {"model": "e", "input": "x", "dimensions": 8}, EMBED_MODEL).param == "dimensions"
    assert check_embeddings({"model": "e", "input": "x", "dimensions": 8}, MATRYOSHKA) is False
    over = refusal(check_embeddings, {"model": "e", "input": "x", "dimensions": 769}, MATRYOSHKA)
    assert over.param == "dimensions" and "768 values" in over.message
