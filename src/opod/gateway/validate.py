"""The ``/v1`` request rules, by OpenAI's API: a bad request is refused here, before admission and before any engine.

An engine given a malformed request answers late (after tokenising a huge prompt), oddly
(200 for ``messages: []``) or with an error the fleet could mistake for its own failure, so
the gateway checks what the client sent first. Each check is a plain function over the parsed
body: type checks on the keys a route reads, no model of the whole body, so a small chat costs
microseconds. Each refusal is a :class:`~opod.http.errors.BadRequest` naming the field (OpenAI's
``param``: ``messages[2].content[0].type``), what is wrong and what to send instead.

Unknown keys pass untouched: engines have their own extensions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opod.http.errors import BadRequest, ContextLengthExceeded, cut, shown

CHARS_PER_TOKEN_AT_MOST = 16
"""No tokenizer an engine here uses averages more characters per token over a whole text (the longest
common tokens are runs of spaces or dashes of about this length), so characters / 16 is a lower bound
of a text's tokens: a prompt over the context by this count is over it for certain."""

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
PART_TYPES = frozenset({"text", "image_url", "input_audio", "audio_url", "video_url", "file", "refusal"})
"""OpenAI's content parts, and vLLM's ``audio_url``/``video_url``."""
_NEEDS = {"image_url": "vision", "video_url": "vision", "input_audio": "audio", "audio_url": "audio"}
_TEXT_ONLY_ROLES = frozenset({"system", "developer", "tool"})
_PLAIN_ROLES = frozenset({"system", "developer", "user", "assistant"})
"""Roles whose text message needs no field besides its content."""
MULTIPLE_CHOICE_ENGINES = frozenset({"vllm", "sglang", "sim"})
"""Engines that answer ``n > 1`` in one request; llama-server and Ollama answer one choice."""
MAX_STOP = 4
MAX_N = 128
MAX_EMBEDDING_INPUTS = 2048


@dataclass(frozen=True, slots=True)
class ModelTraits:
    """What the rules need to know of the model a request names; ``None`` where it is unknown, which lets a request pass."""

    id: str
    context: int | None = None
    """Tokens one request may use (prompt and answer together)."""
    capabilities: frozenset[str] | None = None
    """The catalog entry's capabilities; ``None`` when it states none."""
    engines: frozenset[str] = frozenset()
    """The engines serving it now (``llamacpp``, ``vllm``, ...); empty when unknown."""
    dimensions: int | None = None
    """An embedding model's vector size, as its catalog entry states it."""
    matryoshka: bool = False
    """Its catalog entry says its vectors may be cut (a Matryoshka model): ``dimensions`` is honoured."""

    def lacks(self, capability: str) -> bool:
        return self.capabilities is not None and capability not in self.capabilities


Check = Callable[[dict[str, Any], ModelTraits], bool]
"""A route's rules: raises for a bad request; True when it changed the payload (which must then be sent re-encoded)."""


def no_check(payload: dict[str, Any], model: ModelTraits) -> bool:
    """For a route with no rules of its own."""
    return False


# --- the body itself ------------------------------------------------------------------------------


def check_content_type(value: bytes | None) -> None:
    """A body must be sent as JSON; no ``Content-Type`` at all is taken as JSON, as most servers do."""
    if value is None or value == b"application/json":  # what nearly every client sends: nothing to take apart
        return
    media = value.split(b";", 1)[0].strip().lower()
    if media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json")):
        return
    sent = value.decode("latin-1")
    raise BadRequest(
        f"The body must be JSON sent with Content-Type: application/json (this request says {shown(sent)}).",
        param="Content-Type",
    )


def require_model(payload: dict[str, Any]) -> str:
    """The ``model`` the client named; ``"auto"`` is a name too (the caller decides what it means)."""
    model = payload.get("model")
    if model is None or model == "":
        raise BadRequest("model is required: name the model to use (GET /v1/models lists them).", param="model")
    if not isinstance(model, str):
        raise BadRequest(
            f"model must be a string naming a model, not {_kind(model)} (GET /v1/models lists them).", param="model"
        )
    return model


# --- the routes --------------------------------------------------------------------------------


def check_chat(payload: dict[str, Any], model: ModelTraits) -> bool:
    """``/v1/chat/completions``."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        what = "missing" if messages is None else "empty" if isinstance(messages, list) else _kind(messages)
        raise BadRequest(
            f"messages must be a non-empty list of messages ({what} here), e.g. "
            '[{"role": "user", "content": "Hello"}].',
            param="messages",
        )
    chars = 0
    for i, message in enumerate(messages):
        if type(message) is dict:
            # The common message (text from a role that takes plain text, no tool calls) has nothing else to check;
            # any other goes through every rule of _check_message.
            content = message.get("content")
            role = message.get("role")
            if type(content) is str and type(role) is str and role in _PLAIN_ROLES and "tool_calls" not in message:
                chars += len(content)
                continue
        chars += _check_message(message, i, model)
    _check_sampling(payload, model)
    if "tools" in payload or "functions" in payload or "tool_choice" in payload:
        _check_tools(payload, model)
    if model.context is not None and chars > model.context:
        _check_fits(model, "messages", chars, lambda: [_message_text(m) for m in messages])
    return False


def check_completion(payload: dict[str, Any], model: ModelTraits) -> bool:
    """``/v1/completions``: a ``prompt`` (text, texts, token ids, lists of token ids) and the samplers."""
    if "prompt" not in payload or payload["prompt"] is None:
        raise BadRequest('prompt is required: the text to continue, e.g. "prompt": "Once upon a time".', param="prompt")
    texts, tokens = _texts_or_tokens(payload["prompt"], "prompt", allow_empty=True)
    _check_sampling(payload, model)
    if model.context is not None:
        for count in tokens:
            if count > model.context:
                _too_long(model, "prompt", count, exact=True)
        for text in texts:
            if len(text) > model.context:
                _check_fits(model, "prompt", len(text), [text])
    return False


def check_embeddings(payload: dict[str, Any], model: ModelTraits) -> bool:
    """``/v1/embeddings``: ``input`` (text, texts, token ids), each within the model's context.

    ``truncate_prompt_tokens`` (vLLM's name: a token count, or -1 for the model's limit) asks for
    each input to be cut to that many tokens instead; the gateway cuts token ids itself and leaves
    text to the engine, which holds the tokenizer.
    """
    if "input" not in payload or payload["input"] is None:
        raise BadRequest('input is required: a text or a list of texts to embed, e.g. "input": "Hello".', param="input")
    texts, tokens = _texts_or_tokens(payload["input"], "input", allow_empty=False)
    if len(texts) + len(tokens) > MAX_EMBEDDING_INPUTS:
        raise BadRequest(
            f"input holds {len(texts) + len(tokens)} items; send at most {MAX_EMBEDDING_INPUTS} per request.",
            param="input",
        )
    encoding = payload.get("encoding_format")
    if encoding is not None and encoding not in ("float", "base64"):
        raise BadRequest(
            f"encoding_format must be 'float' or 'base64', not {shown(encoding)}.", param="encoding_format"
        )
    _check_dimensions(payload, model)
    cut = payload.get("truncate_prompt_tokens")
    if cut is not None:
        if not _is_int(cut) or (cut < 1 and cut != -1):
            raise BadRequest(
                f"truncate_prompt_tokens must be a token count ≥ 1, or -1 for the model's limit; not {shown(cut)}.",
                param="truncate_prompt_tokens",
            )
        limit = model.context if cut == -1 else cut if model.context is None else min(cut, model.context)
        return limit is not None and _cut_token_inputs(payload, limit)
    if model.context is None:
        return False
    for count in tokens:
        if count > model.context:
            _too_long(model, "input", count, exact=True, hint="or send truncate_prompt_tokens to have it cut")
    for text in texts:
        if len(text) > model.context:
            _check_fits(model, "input", len(text), [text], hint="or send truncate_prompt_tokens to have it cut")
    return False


def check_rerank(payload: dict[str, Any], model: ModelTraits) -> bool:
    """``/v1/rerank``: a ``query`` and a non-empty list of ``documents`` (texts, or objects with a ``text``)."""
    query = payload.get("query")
    if not isinstance(query, str) or not query:
        raise BadRequest("query must be a non-empty string: what the documents are ranked against.", param="query")
    documents = payload.get("documents")
    if not isinstance(documents, list) or not documents:
        raise BadRequest(
            'documents must be a non-empty list of texts to rank, e.g. ["first", "second"].', param="documents"
        )
    for i, document in enumerate(documents):
        text = document.get("text") if isinstance(document, dict) else document
        if not isinstance(text, str):
            raise BadRequest(
                f"documents[{i}] must be a string (or an object with a string text), not {_kind(document)}.",
                param=f"documents[{i}]",
            )
        if model.context is not None and len(query) + len(text) > model.context:
            _check_fits(model, f"documents[{i}]", len(query) + len(text), [query, text])
    top_n = payload.get("top_n")
    if top_n is not None and (not _is_int(top_n) or top_n < 1):
        raise BadRequest(f"top_n must be an integer ≥ 1, not {shown(top_n)}.", param="top_n")
    return False


# --- messages ------------------------------------------------------------------------------------


def _check_message(message: Any, i: int, model: ModelTraits) -> int:
    """Raises for a malformed message; returns the characters of its text, for the context estimate."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{where} must be an object with a role and content, not {_kind(message)}.", param=where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        sent = "missing" if role is None else shown(role)
        raise BadRequest(
            f"{where}.role must be one of {', '.join(sorted(ROLES))} ({sent} here).", param=f"{where}.role"
        )
    content = message.get("content")
    if content is None:
        if role == "assistant" and not (message.get("tool_calls") or message.get("function_call")):
            raise BadRequest(
                f"{where}.content is required unless the assistant message has tool_calls.", param=f"{where}.content"
            )
        if role not in ("assistant", "function"):
            raise BadRequest(
                f"{where}.content is required for a {role} message: a string, or a list of content parts.",
                param=f"{where}.content",
            )
        chars = 0
    elif isinstance(content, str):
        chars = len(content)
    elif isinstance(content, list):
        chars = _check_parts(content, f"{where}.content", role, model)
    else:
        raise BadRequest(
            f"{where}.content must be a string or a list of content parts, not {_kind(content)}.",
            param=f"{where}.content",
        )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise BadRequest(
            f"{where}.tool_call_id is required for a tool message: the id of the tool call it answers.",
            param=f"{where}.tool_call_id",
        )
    if role == "function" and not isinstance(message.get("name"), str):
        raise BadRequest(f"{where}.name is required for a function message.", param=f"{where}.name")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise BadRequest(
                f"{where}.tool_calls belongs on an assistant message, not a {role} one.", param=f"{where}.tool_calls"
            )
        if not isinstance(tool_calls, list) or not all(isinstance(c, dict) for c in tool_calls):
            raise BadRequest(f"{where}.tool_calls must be a list of tool call objects.", param=f"{where}.tool_calls")
    return chars


def _check_parts(parts: list[Any], where: str, role: str, model: ModelTraits) -> int:
    chars = 0
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in PART_TYPES:
            sent = _kind(part) if not isinstance(part, dict) else "no type" if kind is None else shown(kind)
            raise BadRequest(
                f"{at}.type must be one of {', '.join(sorted(PART_TYPES))} ({sent} here).", param=f"{at}.type"
            )
        if kind == "text" or kind == "refusal":
            text = part.get(kind)
            if not isinstance(text, str):
                raise BadRequest(f"{at}.{kind} must be a string.", param=f"{at}.{kind}")
            chars += len(text)
            continue
        if role in _TEXT_ONLY_ROLES or role == "assistant":
            raise BadRequest(
                f"{at}.type is {shown(kind)}, but a {role} message takes text parts only.", param=f"{at}.type"
            )
        needs = _NEEDS.get(kind)
        if needs is not None and model.lacks(needs):
            raise BadRequest(
                f"{at}.type is {shown(kind)}, but the model {shown(model.id)} does not take {kind} input (it has no {needs} capability); "
                f"send text, or use a model with {needs} (opod catalog ls).",
                param=f"{at}.type",
            )
        if part.get(kind) is None:
            raise BadRequest(f"{at}.{kind} is required for a {kind} part.", param=f"{at}.{kind}")
    return chars


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text") or p.get("refusal") or "" for p in content)
    return ""


# --- samplers and tools -----------------------------------------------------------------------


def _check_sampling(payload: dict[str, Any], model: ModelTraits) -> None:
    # A request names few of these fields: only those it names are checked, in this order (which refusal a request
    # with several faults gets), by membership tests rather than a look-up of every field.
    for name, rule in _SAMPLING_RULES:
        if name in payload:
            value = payload[name]
            if value is not None:
                rule(name, value, model)


def _token_limit(name: str, value: Any, model: ModelTraits) -> None:
    if not _is_int(value) or value < 1:
        raise BadRequest(
            f"{name} must be an integer ≥ 1 (the most tokens to generate), not {shown(value)}.", param=name
        )
    if model.context is not None and value > model.context:
        raise BadRequest(
            f"{name}={shown(value)} is more than the model {shown(model.id)} can hold: its context is {model.context} "
            f"tokens, prompt included; ask for fewer.",
            param=name,
        )


def _in_range(low: float, high: float) -> Callable[[str, Any, ModelTraits], None]:
    def rule(name: str, value: Any, model: ModelTraits) -> None:
        if not _is_number(value) or not low <= value <= high:
            raise BadRequest(f"{name} must be a number from {low:g} to {high:g}, not {shown(value)}.", param=name)

    return rule


def _choices(name: str, value: Any, model: ModelTraits) -> None:
    if not _is_int(value) or not 1 <= value <= MAX_N:
        raise BadRequest(f"{name} must be an integer from 1 to {MAX_N}, not {shown(value)}.", param=name)
    if value > 1 and model.engines and not model.engines <= MULTIPLE_CHOICE_ENGINES:
        engines = ", ".join(sorted(model.engines - MULTIPLE_CHOICE_ENGINES))
        raise BadRequest(
            f"{name}={shown(value)} is not supported: the model {shown(model.id)} is served by {engines}, which answers "
            f"one choice per request; send {name}=1 and repeat the request for more answers.",
            param=name,
        )


def _stop(name: str, value: Any, model: ModelTraits) -> None:
    if not isinstance(value, str):
        if not isinstance(value, list) or len(value) > MAX_STOP or not all(isinstance(s, str) for s in value):
            raise BadRequest(f"stop must be a string or a list of at most {MAX_STOP} strings.", param="stop")


def _flag(name: str, value: Any, model: ModelTraits) -> None:
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, not {shown(value)}.", param=name)


def _stream_options(name: str, value: Any, model: ModelTraits) -> None:
    if not isinstance(value, dict):
        raise BadRequest('stream_options must be an object, e.g. {"include_usage": true}.', param="stream_options")


MAX_TOKEN_ID = (1 << 31) - 1
LOGIT_BIAS_RANGE = 100


def _logit_bias(name: str, bias: Any, model: ModelTraits) -> None:
    """OpenAI's ``logit_bias``: token ids (as text, JSON keys being text) to a bias from -100 to 100."""
    if not isinstance(bias, dict):
        raise BadRequest(
            f'logit_bias must be an object of token ids to biases, e.g. {{"50256": -100}}; not {_kind(bias)}.',
            param="logit_bias",
        )
    for token, value in bias.items():
        if not (token.isascii() and token.isdigit() and int(token) <= MAX_TOKEN_ID):
            raise BadRequest(
                f"logit_bias keys must be token ids (whole numbers, as text); {shown(token)} is not one. "
                "Find a text's ids with the model's tokenizer.",
                param=f"logit_bias.{cut(token, 24)}",
            )
        if not _is_number(value) or not -LOGIT_BIAS_RANGE <= value <= LOGIT_BIAS_RANGE:
            raise BadRequest(
                f"logit_bias[{token}] must be a number from -{LOGIT_BIAS_RANGE} to {LOGIT_BIAS_RANGE}, not {shown(value)}.",
                param=f"logit_bias.{token}",
            )


def _top_logprobs(name: str, value: Any, model: ModelTraits) -> None:
    if not _is_int(value) or not 0 <= value <= 20:
        raise BadRequest(f"top_logprobs must be an integer from 0 to 20, not {shown(value)}.", param="top_logprobs")


def _response_format(name: str, value: Any, model: ModelTraits) -> None:
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise BadRequest(
            "response_format must be an object whose type is text, json_object or json_schema.", param="response_format"
        )


_SAMPLING_RULES: tuple[tuple[str, Callable[[str, Any, ModelTraits], None]], ...] = (
    ("max_tokens", _token_limit),
    ("max_completion_tokens", _token_limit),
    ("temperature", _in_range(0.0, 2.0)),
    ("top_p", _in_range(0.0, 1.0)),
    ("presence_penalty", _in_range(-2.0, 2.0)),
    ("frequency_penalty", _in_range(-2.0, 2.0)),
    ("n", _choices),
    ("best_of", _choices),
    ("stop", _stop),
    ("stream", _flag),
    ("logprobs", _flag),
    ("parallel_tool_calls", _flag),
    ("stream_options", _stream_options),
    ("logit_bias", _logit_bias),
    ("top_logprobs", _top_logprobs),
    ("response_format", _response_format),
)
"""Each sampling field's rule (called with the field's name, its value when not null, and the model)."""


def _check_tools(payload: dict[str, Any], model: ModelTraits) -> None:
    tools = payload.get("tools")
    functions = payload.get("functions")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest(f"tools must be a list of tools, not {_kind(tools)}.", param="tools")
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
                raise BadRequest(
                    f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}.',
                    param=f"tools[{i}]",
                )
            if not isinstance(function.get("name"), str) or not function["name"]:
                raise BadRequest(
                    f"tools[{i}].function.name is required: the name the model calls the tool by.",
                    param=f"tools[{i}].function.name",
                )
    choice = payload.get("tool_choice")
    if choice is not None and choice not in ("none", "auto", "required"):
        name = (
            choice.get("function", {}).get("name")
            if isinstance(choice, dict) and isinstance(choice.get("function"), dict)
            else None
        )
        if not isinstance(name, str):
            raise BadRequest(
                'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.',
                param="tool_choice",
            )
    if (tools or functions) and model.lacks("tools"):
        param = "tools" if tools else "functions"
        raise BadRequest(
            f"The model {shown(model.id)} cannot call tools (its catalog entry has no tools capability); "
            f"leave out {param}, or use a model with tools (opod catalog ls).",
            param=param,
        )


# --- inputs and the context --------------------------------------------------------------------


def _texts_or_tokens(value: Any, name: str, *, allow_empty: bool) -> tuple[list[str], list[int]]:
    """``value`` as its texts and the lengths of its token-id lists; raises unless it is one of OpenAI's input shapes."""
    if isinstance(value, str):
        if not value and not allow_empty:
            raise BadRequest(f"{name} must not be empty.", param=name)
        return [value], []
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            if not allow_empty and not all(value):
                raise BadRequest(f"{name}[{[bool(v) for v in value].index(False)}] must not be empty.", param=name)
            return value, []
        if all(_is_int(v) for v in value):
            return [], [len(value)]
        if all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
            return [], [len(v) for v in value]
    raise BadRequest(
        f"{name} must be a non-empty string, a list of strings, a list of token ids or a list of such lists.",
        param=name,
    )


def _check_fits(
    model: ModelTraits, param: str, chars: int, texts: Callable[[], list[str]] | list[str], hint: str = ""
) -> None:
    """Refuse when the text's tokens are certainly more than the model's context; the caller knows ``chars`` > context."""
    assert model.context is not None
    at_least = -(-chars // CHARS_PER_TOKEN_AT_MOST)
    if at_least <= model.context < chars // 2:
        # Every word is at least one token to a tokenizer that splits at white space first (all those here do).
        at_least = max(at_least, sum(len(t.split()) for t in (texts if isinstance(texts, list) else texts())))
    if at_least > model.context:
        _too_long(model, param, at_least, exact=False, hint=hint)


def _too_long(model: ModelTraits, param: str, tokens: int, *, exact: bool, hint: str = "") -> None:
    counted = f"{tokens} tokens" if exact else f"at least {tokens} tokens (estimated from its length)"
    raise ContextLengthExceeded(
        f"This model's maximum context length is {model.context} tokens, and {param} comes to "
        f"{counted}; shorten it{', ' + hint if hint else ''}.",
        param=param,
    )


def _cut_token_inputs(payload: dict[str, Any], limit: int) -> bool:
    """Cut token-id inputs to ``limit`` ids each; True when one was longer."""
    value = payload["input"]
    if isinstance(value, list) and value and _is_int(value[0]) and len(value) > limit:
        payload["input"] = value[:limit]
        return True
    if isinstance(value, list) and value and isinstance(value[0], list) and any(len(v) > limit for v in value):
        payload["input"] = [v[:limit] for v in value]
        return True
    return False


# --- small helpers -------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive_int(payload: dict[str, Any], name: str) -> None:
    value = payload.get(name)
    if value is not None and (not _is_int(value) or value < 1):
        raise BadRequest(f"{name} must be an integer ≥ 1, not {shown(value)}.", param=name)


def _check_dimensions(payload: dict[str, Any], model: ModelTraits) -> None:
    """``dimensions`` on an embedding: up to the model's own size where it is a Matryoshka model (the gateway cuts
    its vectors, :mod:`opod.gateway.embeddings`), its own size alone otherwise; refused rather than ignored."""
    _positive_int(payload, "dimensions")
    wanted = payload.get("dimensions")
    if wanted is None or wanted == model.dimensions:
        return
    if not model.matryoshka:
        size = f" (its vectors have {model.dimensions} values)" if model.dimensions else ""
        raise BadRequest(
            f"dimensions={wanted} is not supported: the model {shown(model.id)} cannot shorten its embeddings{size}; "
            "its catalog entry does not say it is a Matryoshka model. Leave out dimensions, or use one that is "
            "(opod catalog ls).",
            param="dimensions",
        )
    if model.dimensions and wanted > model.dimensions:
        raise BadRequest(
            f"dimensions={wanted} is more than the model {shown(model.id)} has: its vectors have {model.dimensions} "
            "values; ask for that many or fewer.",
            param="dimensions",
        )


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if _is_number(value) else type(value).__name__
    )
