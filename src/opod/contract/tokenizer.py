"""A deterministic, self-contained tokenizer and chat template.

Text splits into pieces (a word with its leading space, one punctuation mark,
or a run of whitespace); each piece maps to an id in a 32k vocabulary through
CRC-32, which is stable across processes and machines. Chat messages render as
``<|role|>\\ncontent\\n`` after a ``<s>`` token, and the generation prompt is
``<|assistant|>\\n``. Generated words are pieces of this same tokenizer, so an
answer re-sent in the next turn tokenizes to the ids it was generated as, and
the follow-up request hits the prefix cache like it would on a real engine.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["VOCAB_SIZE", "BOS", "EOS", "Tokenizer", "message_text", "render_chat", "render_message"]

VOCAB_SIZE = 32000
UNK, BOS, EOS = 0, 1, 2
_SPECIAL = {
    "<unk>": UNK,
    "<s>": BOS,
    "</s>": EOS,
    "<|system|>": 3,
    "<|user|>": 4,
    "<|assistant|>": 5,
    "<|tool|>": 6,
    "<|developer|>": 7,
}
_FIRST_PLAIN = 256
"""Ids below this are reserved for special tokens, so a piece never collides with one."""

_PIECES = re.compile(r"<\|[a-z_]+\|>|</?s>| ?[^\W_]+| ?_+| ?[^\w\s]|\s+")
_CACHE_LIMIT = 200_000
MESSAGE_CACHE_CHARS = 8_000_000
"""Rendered messages whose ids are kept, in characters of text: system prompts and earlier turns come back with every request."""
_GENERATION_PROMPT = "<|assistant|>\n"


def message_text(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return str(content)


def render_message(message: Mapping[str, Any]) -> str:
    """One message in the simulator's chat template."""
    return f"<|{message.get('role') or 'user'}|>\n{message_text(message.get('content'))}\n"


def render_chat(messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The simulator's chat template."""
    parts = ["<s>", *(render_message(m) for m in messages)]
    if add_generation_prompt:
        parts.append(_GENERATION_PROMPT)
    return "".join(parts)


class Tokenizer:
    """Text ↔ ids. Decoding knows every piece it has encoded (and every word the generator uses)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = dict(_SPECIAL)
        self._pieces: dict[int, str] = {v: k for k, v in _SPECIAL.items()}
        self._messages: dict[str, list[int]] = {}
        self._message_chars = 0

    def piece_id(self, piece: str) -> int:
        tid = self._ids.get(piece)
        if tid is None:
            tid = _SPECIAL.get(piece)
            if tid is None:
                tid = _FIRST_PLAIN + zlib.crc32(piece.encode()) % (VOCAB_SIZE - _FIRST_PLAIN)
            if len(self._ids) < _CACHE_LIMIT:
                self._ids[piece] = tid
                self._pieces.setdefault(tid, piece)
        return tid

    def pieces(self, text: str) -> list[str]:
        return _PIECES.findall(text)

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        out: list[int] = []
        append = out.append
        for piece in _PIECES.findall(text):
            tid = ids.get(piece)
            append(tid if tid is not None else self.piece_id(piece))
        return out

    def encode_chat(self, messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """The ids of ``render_chat``'s text, message by message.

        A rendered message starts with ``<`` and ends with a newline, so no piece spans two
        messages and the ids join up exactly; each message's ids are kept for the next request.
        """
        out = [BOS]
        for message in messages:
            out += self._message_ids(render_message(message))
        if add_generation_prompt:
            out += self._message_ids(_GENERATION_PROMPT)
        return out

    def _message_ids(self, text: str) -> list[int]:
        ids = self._messages.get(text)
        if ids is None:
            ids = self.encode(text)
            if len(text) <= MESSAGE_CACHE_CHARS // 4:
                while self._messages and self._message_chars + len(text) > MESSAGE_CACHE_CHARS:
                    oldest = next(iter(self._messages))
                    del self._messages[oldest]
                    self._message_chars -= len(oldest)
                self._messages[text] = ids
                self._message_chars += len(text)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Unknown ids decode to nothing, as vLLM's ``/detokenize`` answers for an out-of-vocabulary id."""
        get = self._pieces.get
        return "".join(get(i, "") for i in ids)

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return [self._pieces.get(i, "") for i in ids]
