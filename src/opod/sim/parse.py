"""Reading OpenAI request bodies: the fields the simulator uses, checked; every other field accepted.

A bad field is a 400 that names it (``param``) and says what is accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from opod.contract.tokenizer import BOS, Tokenizer, message_text
from opod.sim.errors import SimHTTPError, bad_request, model_not_found
from opod.sim.tools import PlannedCall, plan_tool_calls, tools_prompt

__all__ = ["MAX_N", "GenRequest", "read_json", "parse_chat", "parse_completion", "resolve_model", "embedding_inputs"]


MAX_N = 128
"""The most choices one request may ask for (OpenAI's limit)."""


@dataclass(slots=True)
class GenRequest:
    model: str
    prompt: list[int]
    max_tokens: int
    """The answer's token budget: what was asked for, or what the context leaves."""
    asked_max_tokens: int | None
    stream: bool
    include_usage: bool
    seed: int | None
    ignore_eos: bool
    min_tokens: int
    echo_text: str
    n: int = 1
    """Choices to answer (``n``)."""
    tool_calls: list[PlannedCall] = field(default_factory=list)
    """The tools the answer calls; empty for a text answer."""


async def read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise bad_request("body", f"the body is not valid JSON ({err}); send a JSON object") from None
    if not isinstance(body, dict):
        raise bad_request("body", "the body must be a JSON object")
    return body


def resolve_model(body: dict[str, Any], served: tuple[str, ...], default: str | None = None) -> str:
    model = body.get("model")
    if model is None or model == "":
        if default is not None:
            return default
        raise bad_request("model", "`model` is required; GET /v1/models lists the served names")
    if not isinstance(model, str):
        raise bad_request("model", "`model` must be a string")
    if model not in served:
        raise model_not_found(model, served)
    return model


def _int(body: dict[str, Any], name: str, lo: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(name, f"`{name}` must be an integer (got {value!r})")
    if lo is not None and value < lo:
        raise bad_request(name, f"`{name}` must be at least {lo} (got {value})")
    return value


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(name, f"`{name}` must be true or false (got {value!r})")
    return value


def _common(body: dict[str, Any], model: str, prompt: list[int], echo_text: str, max_model_len: int) -> GenRequest:
    n = _int(body, "n", 1) or 1
    if n > MAX_N:
        raise bad_request("n", f"n={n} is more than {MAX_N} choices; ask for fewer")
    asked = _int(body, "max_completion_tokens", 1)
    if asked is None:
        asked = _int(body, "max_tokens", 1)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise bad_request(name, f"`{name}` must be a number (got {v!r})")
    if len(prompt) >= max_model_len:
        raise SimHTTPError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{len(prompt)} input tokens; shorten the prompt.",
            param="input_tokens",
        )
    if asked is not None and asked > max_model_len:
        raise bad_request(
            "max_tokens",
            f"max_tokens={asked} cannot be greater than max_model_len={max_model_len}; ask for fewer tokens",
        )
    room = max_model_len - len(prompt)
    budget = min(asked, room) if asked is not None else room
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("stream_options", '`stream_options` must be an object such as {"include_usage": true}')
    include_usage = bool(stream and options and options.get("include_usage"))
    return GenRequest(
        model=model,
        prompt=prompt,
        max_tokens=budget,
        asked_max_tokens=asked,
        stream=stream,
        include_usage=include_usage,
        seed=_int(body, "seed"),
        ignore_eos=_bool(body, "ignore_eos"),
        min_tokens=_int(body, "min_tokens", 0) or 0,
        echo_text=echo_text,
        n=n,
    )


def parse_chat(body: dict[str, Any], served: tuple[str, ...], tokenizer: Tokenizer, max_model_len: int) -> GenRequest:
    model = resolve_model(body, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", '`messages` is required: a non-empty list of {"role", "content"} objects')
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}]", f"messages[{i}] must be an object with a string `role`")
    calls = plan_tool_calls(body)
    tools = tools_prompt(body)
    prompt = tokenizer.encode_chat([tools, *messages] if tools else messages, add_generation_prompt=True)
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    req = _common(body, model, prompt, message_text(last_user.get("content")), max_model_len)
    req.tool_calls = calls
    return req


def parse_completion(
    body: dict[str, Any], served: tuple[str, ...], tokenizer: Tokenizer, max_model_len: int, add_bos: bool = False
) -> GenRequest:
    """``add_bos``: a text prompt starts with ``<s>``, as llama-server tokenizes one."""
    model = resolve_model(body, served)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids, text = tokenizer.encode(prompt), prompt
        if add_bos and ids[:1] != [BOS]:
            ids.insert(0, BOS)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in prompt)
    ):
        ids, text = list(prompt), tokenizer.decode(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("prompt", "one prompt per request: send a string or a list of token ids, not a batch")
    else:
        raise bad_request("prompt", "`prompt` is required: a string, or a list of token ids (0 ≤ id < 2^31)")
    if not ids:
        raise bad_request("prompt", "`prompt` must not be empty")
    return _common(body, model, ids, text, max_model_len)


def embedding_inputs(value: Any, field: str = "input") -> list[str]:
    """A string or a list of strings (token-id lists are decoded as text ids)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [" ".join(map(str, value))]
    raise bad_request(field, f"`{field}` must be a non-empty string or a list of strings")
