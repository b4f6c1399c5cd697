"""How many tokens a request can cost: the upper bounds its budget reservation holds.

A reservation must be at least what its request will spend, or concurrent requests pass a budget
by what each spends beyond it. The prompt side is bounded without the model's tokenizer: every
token of the tokenizers opod serves (byte-level BPE, SentencePiece with byte fallback, WordPiece)
covers at least one byte of its text, so a text is at most its UTF-8 bytes in tokens, plus
:data:`SPECIAL_TOKENS` for the markers an engine adds around it (BOS, EOS, CLS, SEP, a leading
space). A chat's messages go through the model's chat template, which adds text of its own (role
markers, and some templates a default system prompt): that share is the model's template cost,
counted once per model by a worker (:mod:`opod.gateway.templatecost`), or a worker counts the
rendered prompt itself (:attr:`PromptSize.counted`); a generous allowance bounds it when no
worker can say. Each prompt of a list counts, and each choice of each prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SPECIAL_TOKENS = 4
"""Tokens an engine may add around one text: BOS and EOS (CLS and SEP), a SentencePiece's leading space."""
TEMPLATE_TOKENS = 64
"""A chat template's own tokens when no worker counted them: its generation prompt and a default system prompt."""
MESSAGE_TOKENS = 8
"""A chat template's tokens around each message (role markers) when no worker counted them."""
PART_TOKENS = 2048
"""A message part that is not text (an image, audio): its tokens are the engine's business; this bounds them."""
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's ``max_tokens`` when a ``/v1/completions`` request names none."""
LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
"""The fields a request may bound its completion with, each choice's."""


def size(text: str) -> int:
    """A text's UTF-8 bytes (a lone surrogate counted as its three bytes rather than refused)."""
    # An ASCII text (most prompts) is as many bytes as characters, which Python knows without a copy of the text.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _json_size(value: Any) -> int:
    return size(json.dumps(value, ensure_ascii=False)) if value else 0


@dataclass(frozen=True, slots=True)
class TemplateCost:
    """A chat template's own tokens."""

    base: int
    """The tokens of a chat of one one-token user message: the template's generation prompt, any default
    system prompt, the message's markers, and the message's one token."""
    per_message: int
    """The most a further message adds besides its text, whatever its role."""


@dataclass(frozen=True, slots=True)
class PromptSize:
    """A request's prompt: its texts' sizes, and what a chat template adds."""

    texts: tuple[int, ...]
    """The UTF-8 bytes of each text the engine tokenizes (a prompt, an input, a query with one document); a chat's
    texts (roles, names, contents, tool calls, and the tools unless counted) as one sum."""
    tokens: tuple[int, ...] = ()
    """The length of each prompt given as token ids."""
    messages: int = 0
    """The chat messages that go through the template (0: no template)."""
    parts: int = 0
    """Message parts that are not text."""
    counted: int | None = None
    """The messages' tokens with the template applied, as a worker holding the model counted them."""
    template: TemplateCost | None = None
    """The model's chat template's own tokens, when known."""

    @property
    def prompts(self) -> int:
        """How many prompts the engine answers (a chat is one)."""
        return 1 if self.messages else max(1, len(self.texts) + len(self.tokens))

    def bound(self) -> int:
        """At most this many prompt tokens."""
        if self.messages:
            counted = self.counted
            if counted is None:
                template = self.template
                if template is not None:
                    counted = sum(self.texts) + template.base + template.per_message * (self.messages - 1)
                else:
                    counted = sum(self.texts) + TEMPLATE_TOKENS + MESSAGE_TOKENS * self.messages
            return counted + PART_TOKENS * self.parts
        return sum(self.texts) + sum(self.tokens) + SPECIAL_TOKENS * (len(self.texts) + len(self.tokens))


def prompt_size(
    payload: dict[str, Any], counted: int | None = None, template: TemplateCost | None = None
) -> PromptSize:
    """The prompt of a ``/v1`` request, whatever its route: ``messages``, ``prompt``, ``input``, or a rerank's
    ``query`` and ``documents``. ``counted``: the messages' count a worker made, when one did; ``template``:
    the model's chat template cost, when known."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        # One pass: a chat's bound needs only the sum of its texts' bytes, and the calls' bytes on their own.
        text = calls = parts = 0
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if role:
                text += size(str(role))
            if "name" in message and (name := message["name"]):  # a rare key: tested for, not looked up
                text += size(str(name))
            content = message.get("content")
            if isinstance(content, str):
                text += size(content)
            elif isinstance(content, list):
                for part in content:
                    part_text = part.get("text") if isinstance(part, dict) else None
                    if isinstance(part_text, str):
                        text += size(part_text)
                    else:
                        parts += 1
            if "tool_calls" in message:
                calls += _json_size(message["tool_calls"])
        text += calls
        tools = _json_size(payload["tools"]) if "tools" in payload else 0
        if counted is not None:
            # The worker renders the messages' text; the tools and the calls are on top, each byte at most a token.
            counted += tools + calls
        else:
            text += tools
        return PromptSize((text,), messages=max(1, len(messages)), parts=parts, counted=counted, template=template)
    if "query" in payload and isinstance(payload.get("documents"), list):
        query = size(str(payload.get("query") or ""))
        documents = payload["documents"]
        return PromptSize(tuple(query + size(_document_text(d)) for d in documents))
    value = payload.get("prompt") if "prompt" in payload else payload.get("input")
    texts, tokens = _texts_or_tokens(value)
    suffix = payload.get("suffix")
    if isinstance(suffix, str) and suffix:
        texts = [t + size(suffix) for t in texts] or [size(suffix)]
    return PromptSize(tuple(texts), tuple(tokens))


def _document_text(document: Any) -> str:
    text = document.get("text") if isinstance(document, dict) else document
    return text if isinstance(text, str) else ""


def _texts_or_tokens(value: Any) -> tuple[list[int], list[int]]:
    """The sizes of a prompt's or an input's texts, and the lengths of its token-id lists, in OpenAI's shapes."""
    if isinstance(value, str):
        return [size(value)], []
    if not isinstance(value, list) or not value:
        return [], []
    if all(isinstance(v, str) for v in value):
        return [size(v) for v in value], []
    if all(isinstance(v, int) for v in value):
        return [], [len(value)]
    return [], [len(v) for v in value if isinstance(v, list)]


def asked_limit(payload: dict[str, Any]) -> int | None:
    """The completion tokens each choice may take, as the request asks; ``None`` when it names no limit."""
    for name in LIMITS:
        if name in payload:
            value = payload[name]
            if type(value) is int and value >= 0:
                return value
    return None


def default_limit(path: str, default_max_tokens: int, context: int | None, prompt: PromptSize) -> int | None:
    """The ``max_tokens`` to give a request that names no limit, or ``None`` to leave it to the model's context.

    A chat gets ``default_max_tokens``; a text completion keeps OpenAI's default (16) when that is lower.
    When the prompt may leave less of the context than that, the context bounds the answer already, and
    a limit derived from the prompt's bound could cut an answer that fits.
    """
    limit = default_max_tokens
    if path == "/v1/completions":
        limit = min(limit, COMPLETIONS_DEFAULT_MAX_TOKENS)
    if context is not None and context - prompt.bound() < limit:
        return None
    return limit


def completion_bound(payload: dict[str, Any], context: int | None, prompt: PromptSize, default: int) -> int:
    """At most this many completion tokens: each choice of each prompt its limit, or the model's context
    without one (``default`` when the context is unknown). A prompt's choices are ``n``, or ``best_of`` when
    it asks for more."""
    each = asked_limit(payload)
    if each is None:
        each = context if context is not None else default
    choices = 1
    for name in ("n", "best_of"):
        if name in payload:  # seldom named: tested for, not looked up
            value = payload[name]
            if type(value) is int and value > choices:
                choices = value
    return each * choices * prompt.prompts
