"""A reference for converted embedding models: BERT's WordPiece tokenizer and forward pass in numpy.

Written from the BERT definition (Devlin et al.; Hugging Face's BertModel), and
independent of opod's converter: it reads the original safetensors weights and
vocab.txt, so a converted GGUF served by llama-server can be compared to it.
"""

from __future__ import annotations

import json
import math
import unicodedata
from pathlib import Path

import numpy as np

from opod.weights.safetensors import read_safetensors


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    # BERT counts every non-alphanumeric ASCII character as punctuation, plus Unicode's P* categories.
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(code: int) -> bool:
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0x20000 <= code <= 0x2A6DF
        or 0x2A700 <= code <= 0x2B73F
        or 0x2B740 <= code <= 0x2B81F
        or 0x2B820 <= code <= 0x2CEAF
        or 0xF900 <= code <= 0xFAFF
        or 0x2F800 <= code <= 0x2FA1F
    )


class WordPiece:
    """BertTokenizer for an uncased model: clean, lower-case, strip accents, split punctuation, greedy WordPiece."""

    def __init__(self, vocab_path: Path, max_chars_per_word: int = 100) -> None:
        pieces = vocab_path.read_text(encoding="utf-8").split("\n")
        self.ids = {piece: i for i, piece in enumerate(pieces) if piece}
        self.max_chars = max_chars_per_word

    def _basic(self, text: str) -> list[str]:
        cleaned = []
        for char in text:
            code = ord(char)
            if code == 0 or code == 0xFFFD or (unicodedata.category(char).startswith("C") and char not in "\t\n\r"):
                continue
            if char.isspace():
                cleaned.append(" ")
            elif _is_cjk(code):
                cleaned.append(f" {char} ")
            else:
                cleaned.append(char)
        words = []
        for word in "".join(cleaned).split():
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
            current = ""
            for char in word:
                if _is_punctuation(char):
                    if current:
                        words.append(current)
                    words.append(char)
                    current = ""
                else:
                    current += char
            if current:
                words.append(current)
        return words

    def _wordpiece(self, word: str) -> list[int]:
        if len(word) > self.max_chars:
            return [self.ids["[UNK]"]]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.ids:
                    out.append(self.ids[piece])
                    break
                end -= 1
            else:
                return [self.ids["[UNK]"]]
            start = end
        return out

    def encode(self, text: str) -> list[int]:
        """Token ids with [CLS] first and [SEP] last, as BERT sees a single sentence."""
        ids = [self.ids["[CLS]"]]
        for word in self._basic(text):
            ids.extend(self._wordpiece(word))
        return ids + [self.ids["[SEP]"]]


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


class BertEncoder:
    """BertModel's encoder in float64, with sentence-transformers' mean pooling and L2 normalisation."""

    def __init__(self, model_dir: Path) -> None:
        self.config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        self.w = {
            k.removeprefix("bert."): np.asarray(v, dtype=np.float64)
            for k, v in read_safetensors(model_dir / "model.safetensors").items()
            if v.dtype.kind == "f"
        }
        self.tokenizer = WordPiece(model_dir / "vocab.txt")

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def hidden_states(self, ids: list[int]) -> np.ndarray:
        w, eps = self.w, self.config.get("layer_norm_eps", 1e-12)
        heads = self.config["num_attention_heads"]
        n = len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        for i in range(self.config["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            head_dim = x.shape[1] // heads

            def split(t: np.ndarray, head_dim: int = head_dim) -> np.ndarray:
                return t.reshape(n, heads, head_dim).transpose(1, 0, 2)

            q, k, v = (split(self._linear(x, p + f"attention.self.{m}")) for m in ("query", "key", "value"))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attention = (scores / scores.sum(-1, keepdims=True)) @ v
            attention = attention.transpose(1, 0, 2).reshape(n, -1)
            x = _layer_norm(
                x + self._linear(attention, p + "attention.output.dense"),
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
                eps,
            )
            inner = self._linear(x, p + "intermediate.dense")
            inner = 0.5 * inner * (1.0 + _erf(inner / math.sqrt(2.0)))  # BERT's exact GELU
            x = _layer_norm(
                x + self._linear(inner, p + "output.dense"),
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
                eps,
            )
        return x

    def embed(self, text: str) -> np.ndarray:
        pooled = self.hidden_states(self.tokenizer.encode(text)).mean(axis=0)
        return pooled / np.linalg.norm(pooled)
