"""OpenAI's Responses API (``POST /v1/responses``), served by translating onto chat completions.

Every engine opod runs answers ``/v1/chat/completions``; only vLLM also has its own
``/v1/responses``. Translating here, for every engine, keeps one path: the request
goes through the chat route whole (its rules, admission, routing, retries before the
first byte, the usage row), so a Responses call is served, limited and counted exactly
as the chat call it stands for, on any engine and any fallback. An engine's own
Responses server would also store responses (``previous_response_id``), which opod
does not: a request that needs stored state is refused with a 400 saying so.

The translation is stateless: here the request becomes a chat request, and the chat
answer goes back through :mod:`opod.gateway.responses_answer`, whole or streamed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from opod.gateway.caller import Endpoint, InProcessCaller
from opod.gateway.responses_answer import response_object, translate_stream
from opod.gateway.validate import ModelTraits, check_chat
from opod.http import fastjson
from opod.http.errors import BadRequest, GatewayError, error_response, shown
from opod.http.fastpath import ReadRequest, headers_of, read_whole
from opod.http.inbound import json_object, read_body, sane_request_id

__all__ = ["CHAT_PATH", "chat_request", "check_translated", "responses_endpoint"]

Authenticate = Callable[[dict[bytes, bytes], InProcessCaller | None], object]

RESPONSES_PATH = "/v1/responses"
CHAT_PATH = "/v1/chat/completions"
BODY_CAP = 32 << 20
"""As the chat route's."""

_RESPONSES_ONLY = frozenset(
    {
        "input",
        "instructions",
        "max_output_tokens",
        "text",
        "tools",
        "tool_choice",
        "stream",
        "stream_options",
        "store",
        "include",
        "truncation",
        "reasoning",
        "metadata",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "max_tool_calls",
        "top_logprobs",
        "background",
        "previous_response_id",
        "conversation",
        "prompt",
        "context_management",
    }
)
"""Keys the translation reads or drops; any other key (an engine's extension, such as ``top_k``) travels to the chat route."""
_STATELESS = {
    "previous_response_id": "opod does not store responses; send the whole conversation in `input`",
    "conversation": "opod does not store conversations; send the whole conversation in `input`",
    "background": "opod answers in the foreground only; leave out `background` or set it to false",
    "prompt": "opod does not store prompt templates; send the text in `input` and `instructions`",
}
_ROLES = frozenset({"user", "system", "developer", "assistant"})


# --- the request ---------------------------------------------------------------------------------

_SENT_AS = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text.format",
}
"""A chat request's field → the Responses field it is translated from. A Responses request naming the chat
field itself is refused (as OpenAI refuses it), so every chat refusal of such a field is about the Responses one."""


def check_translated(payload: dict[str, Any], model: ModelTraits) -> bool:
    """The chat route's rules on a request translated by :func:`chat_request`, each refusal naming the field
    the client sent (``max_output_tokens``, not the ``max_tokens`` it became)."""
    try:
        return check_chat(payload, model)
    except BadRequest as refusal:
        param = refusal.param or ""
        head = re.match(r"[a-z_]*", param)
        sent = _SENT_AS.get(head[0]) if head is not None else None
        if sent is not None:
            refusal.message = refusal.message.replace(param, sent)
            refusal.param = sent
        raise


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as the chat completions request that answers it; a 400 naming the field otherwise."""
    for key, why in _STATELESS.items():
        if body.get(key) not in (None, False):
            raise BadRequest(f"{key} is not supported: {why}.", param=key)
    for key, name in _SENT_AS.items():
        if key in body:
            raise BadRequest(
                f"{key} is the Chat Completions API's field; the Responses API takes {name} instead.", param=key
            )
    # Keys with the same name and meaning in both APIs (model, temperature, top_p, user, parallel_tool_calls...) are copied.
    chat: dict[str, Any] = {k: v for k, v in body.items() if k not in _RESPONSES_ONLY}
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions must be a string (the system message).", param="instructions")
        messages.append({"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"))
    chat["messages"] = messages
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise BadRequest(
                f"max_output_tokens must be a whole number of at least 1 (got {shown(limit)}).",
                param="max_output_tokens",
            )
        chat["max_tokens"] = limit
    top_logprobs = body.get("top_logprobs")
    if top_logprobs:
        chat["logprobs"], chat["top_logprobs"] = True, top_logprobs
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    tools = body.get("tools")
    if tools is not None:
        chat["tools"] = _tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false (got {shown(stream)}).", param="stream")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise BadRequest(
            "input is required: a string, or a non-empty list of input items (messages, function calls and "
            "their outputs).",
            param="input",
        )
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f'{where} must be an object such as {{"role": "user", "content": "..."}}.', param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in _ROLES:
                raise BadRequest(
                    f"{where}.role must be one of {', '.join(sorted(_ROLES))} (got {shown(role)}).",
                    param=f"{where}.role",
                )
            out.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": _text_field(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _text_field(item, "name", where),
                    "arguments": _text_field(item, "arguments", where),
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last.get("content"):
                last["tool_calls"].append(call)  # consecutive calls are one assistant turn's parallel calls
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": _text_field(item, "call_id", where), "content": text})
        elif kind == "reasoning":
            continue  # a previous turn's reasoning: chat templates drop it too
        else:
            raise BadRequest(
                f"{where}.type {shown(kind)} is not supported here; send message, function_call or "
                "function_call_output items.",
                param=f"{where}.type",
            )
    return out


def _text_field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{name} must be a string.", param=f"{where}.{name}")
    return value


def _content(value: Any, where: str) -> str | list[dict[str, Any]]:
    """Responses content (a string or input parts) as chat content."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a string or a list of content parts.", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        at = f"{where}[{j}]"
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise BadRequest(
                    f"{at}.image_url must be a URL or a data: URL (file_id is not supported).", param=f"{at}.image_url"
                )
            image: dict[str, Any] = {"url": url}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_audio" and isinstance(part.get("input_audio"), dict):
            parts.append({"type": "input_audio", "input_audio": part["input_audio"]})
        else:
            raise BadRequest(
                f"{at} must be an input_text, input_image or input_audio part with its field (got type {shown(kind)}).",
                param=f"{at}.type",
            )
    return parts


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise BadRequest(
        'text.format must be {"type": "text"}, {"type": "json_object"} or '
        '{"type": "json_schema", "name": ..., "schema": {...}}.',
        param="text.format",
    )


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list of function tools.", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadRequest(
                f'tools[{i}] must be a function tool {{"type": "function", "name": ..., "parameters": {{...}}}}; '
                f"opod has no built-in tools (got type {shown(kind)}).",
                param=f"tools[{i}]",
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}.', param="tool_choice"
    )


# --- the route -----------------------------------------------------------------------------------

_DROP = frozenset({"content-length", "content-type"})


def responses_endpoint(chat: Endpoint, authenticate: Authenticate | None = None) -> Endpoint:
    """``POST /v1/responses``, answered by ``chat``, the gateway's own ``/v1/chat/completions`` handler.

    ``authenticate`` (the gateway's key check, raising on a bad key) runs before the body is
    read, so a caller without a key hears 401 whatever it sent, as on every other route.
    """

    async def endpoint(request: Request, caller: InProcessCaller | None = None) -> Response:
        headers = headers_of(request)
        request_id = sane_request_id(headers.get(b"x-request-id"))
        try:
            if authenticate is not None:
                authenticate(headers, caller)
            raw = read_whole(request)
            if raw is None:
                raw = await read_body(request, BODY_CAP)
            body = json_object(raw)
            payload = chat_request(body)
        except GatewayError as err:
            return error_response(err, request_id)
        answer = await chat(_as_chat(request, json.dumps(payload).encode()), caller)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in _DROP}
        if isinstance(answer, StreamingResponse):
            model = str(payload.get("model") or "")
            return StreamingResponse(
                translate_stream(answer.body_iterator, body, model),
                status_code=answer.status_code,
                media_type="text/event-stream",
                headers=kept,
            )
        if answer.status_code != 200:
            return answer
        try:
            chat_body = fastjson.loads(bytes(answer.body))
        except ValueError:
            return answer
        if not isinstance(chat_body, dict):
            return answer
        return Response(
            json.dumps(response_object(chat_body, body)).encode(), media_type="application/json", headers=kept
        )

    return endpoint


def _as_chat(request: Request, body: bytes) -> Request:
    """The request as the chat route receives it: the chat path and the translated body, every other header as sent."""
    raw = [(k, v) for k, v in request.scope["headers"] if k.lower() != b"content-length"]
    raw.append((b"content-length", str(len(body)).encode()))
    scope = {**request.scope, "path": CHAT_PATH, "raw_path": CHAT_PATH.encode(), "headers": raw}
    return ReadRequest(scope, body)
