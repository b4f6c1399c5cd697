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

__all__ = ["VOCAB_SIZE", "BOS", "EOS", "Tokenizer", "message_text", "render_chat"]

VOCAB_SIZE = 32000
UNK, BOS, EOS = 0, 1, 2
_SPECIAL = {"<unk>": UNK, "<s>": BOS, "</s>": EOS, "<|system|>": 3, "<|user|>": 4, "<|assistant|>": 5, "<|tool|>": 6, "<|developer|>": 7}
_FIRST_PLAIN = 256
"""Ids below this are reserved for special tokens, so a piece never collides with one."""

_PIECES = re.compile(r"<\|[a-z_]+\|>|</?s>| ?[^\W_]+| ?_+| ?[^\w\s]|\s+")
_CACHE_LIMIT = 200_000


def message_text(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return str(content)


def render_chat(messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The simulator's chat template."""
    parts = ["<s>"]
    for m in messages:
        parts.append(f"<|{m.get('role') or 'user'}|>\n{message_text(m.get('content'))}\n")
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


class Tokenizer:
    """Text ↔ ids. Decoding knows every piece it has encoded (and every word the generator uses)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = dict(_SPECIAL)
        self._pieces: dict[int, str] = {v: k for k, v in _SPECIAL.items()}

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
        return self.encode(render_chat(messages, add_generation_prompt))

    def decode(self, ids: Sequence[int]) -> str:
        """Unknown ids decode to nothing, as vLLM's ``/detokenize`` answers for an out-of-vocabulary id."""
        get = self._pieces.get
        return "".join(get(i, "") for i in ids)

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return [self._pieces.get(i, "") for i in ids]
