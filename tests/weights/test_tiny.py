"""The tiny test GGUFs: deterministic, readable, and served by a real llama-server."""

from __future__ import annotations

import hashlib
import string
from pathlib import Path

import gguf
import numpy as np
import pytest

from opod.weights import write_tiny_embedding_model, write_tiny_llama
from opod.weights.tiny import CHATML_TEMPLATE
from tests.support import llama_server

PRINTABLE = set(string.printable) - set("\x0b\x0c")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def field_value(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def test_same_seed_gives_the_same_bytes_and_another_seed_does_not(tmp_path: Path) -> None:
    a = write_tiny_llama(tmp_path / "a.gguf", seed=7)
    b = write_tiny_llama(tmp_path / "b.gguf", seed=7)
    c = write_tiny_llama(tmp_path / "c.gguf", seed=8)
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)
    assert 100_000 < a.stat().st_size < 2_000_000  # small enough to build per test


def test_the_file_reads_back_as_a_llama_with_an_spm_vocabulary_and_chatml(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", layers=3, dim=96, heads=6, kv_heads=2, ff=128, context=1024)
    reader = gguf.GGUFReader(path)
    assert field_value(reader, "general.architecture") == "llama"
    assert field_value(reader, "llama.block_count") == 3
    assert field_value(reader, "llama.embedding_length") == 96
    assert field_value(reader, "llama.attention.head_count") == 6
    assert field_value(reader, "llama.attention.head_count_kv") == 2
    assert field_value(reader, "llama.context_length") == 1024
    assert field_value(reader, "tokenizer.ggml.model") == "llama"
    assert field_value(reader, "tokenizer.chat_template") == CHATML_TEMPLATE
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    types = field_value(reader, "tokenizer.ggml.token_type")
    byte_tokens = {t for t, kind in zip(tokens, types) if kind == gguf.TokenType.BYTE}
    assert byte_tokens == {f"<0x{b:02X}>" for b in range(256)}
    assert {"<|im_start|>", "<|im_end|>"} <= set(tokens)
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 3 + 3 * 9
    # ggml's ne is the numpy shape reversed: K/V project 96 → 2 heads × 16.
    assert list(tensors["blk.0.attn_k.weight"].shape) == [96, 32]
    output = np.asarray(tensors["output.weight"].data).reshape(len(tokens), 96)
    normal = np.array([kind == gguf.TokenType.NORMAL for kind in types])
    assert not output[~normal].any(), "control, byte and unknown tokens must never be generated"
    assert np.abs(output[normal]).sum(axis=1).min() > 0


def test_bad_shapes_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dim .* must divide by heads"):
        write_tiny_llama(tmp_path / "x.gguf", dim=65, heads=4)
    with pytest.raises(ValueError, match="layers must be > 0"):
        write_tiny_llama(tmp_path / "x.gguf", layers=0)
    with pytest.raises(ValueError, match="says must be one of the vocabulary's words"):
        write_tiny_llama(tmp_path / "x.gguf", says="zebra")
    assert not list(tmp_path.iterdir()), "a refused build leaves nothing behind"


def test_a_model_that_says_a_word_keeps_the_plain_files_bytes(tmp_path: Path) -> None:
    plain = write_tiny_llama(tmp_path / "plain.gguf", seed=5)
    assert digest(plain) == digest(write_tiny_llama(tmp_path / "again.gguf", seed=5))
    assert digest(write_tiny_llama(tmp_path / "yes.gguf", seed=5, says="yes")) != digest(plain)


@pytest.mark.engine
def test_a_model_that_says_a_word_answers_every_prompt_with_it(tmp_path: Path) -> None:
    for word in ("yes", "no"):
        model = write_tiny_llama(tmp_path / f"{word}.gguf", says=word)
        with llama_server.running(model, alias=word) as base:
            for prompt in ("Is the sky blue?", "hello world, how is the fleet?", "2+2="):
                ask = {"model": word, "messages": [{"role": "user", "content": prompt}], "max_tokens": 3}
                text = llama_server.post_json(base + "/v1/chat/completions", ask)["choices"][0]["message"]["content"]
                assert text.split() == [word] * 3, f"{prompt!r} answered {text!r}"


@pytest.mark.engine
def test_llama_server_serves_the_tiny_model_with_printable_repeatable_text(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    with llama_server.running(model, alias="tiny") as base:
        ask = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello world, how is the fleet?"}],
            "max_tokens": 24,
            "temperature": 0,
        }
        first = llama_server.post_json(base + "/v1/chat/completions", ask)
        second = llama_server.post_json(base + "/v1/chat/completions", ask)
        text = first["choices"][0]["message"]["content"]
        assert text.strip(), "the model produced no text"
        assert set(text) <= PRINTABLE, f"unprintable output: {text!r}"
        assert first["usage"]["completion_tokens"] == 24
        assert second["choices"][0]["message"]["content"] == text, "temperature 0 must repeat itself"
        sampled = llama_server.post_json(
            base + "/v1/completions",
            {"model": "tiny", "prompt": "the model", "max_tokens": 48, "temperature": 1.0, "seed": 3},
        )["choices"][0]["text"]
        assert sampled.strip() and set(sampled) <= PRINTABLE, f"unprintable sampled output: {sampled!r}"
        # The chat template's markers are single control tokens, not spelled out.
        for marker in ("<|im_start|>", "<|im_end|>"):
            tokens = llama_server.post_json(base + "/tokenize", {"content": marker, "parse_special": True})["tokens"]
            assert len(tokens) == 1, f"{marker} should be one control token, got {tokens}"


@pytest.mark.engine
def test_llama_server_serves_the_tiny_embedding_model(tmp_path: Path) -> None:
    model = write_tiny_embedding_model(tmp_path / "tiny-bert.gguf", dim=32)
    again = write_tiny_embedding_model(tmp_path / "again.gguf", dim=32)
    assert digest(model) == digest(again)
    with llama_server.running(model, "--embeddings", "--pooling", "mean", alias="tiny-bert") as base:
        answer = llama_server.post_json(
            base + "/v1/embeddings", {"model": "tiny-bert", "input": ["hello world", "the fleet is ready"]}
        )
        vectors = [np.array(d["embedding"]) for d in answer["data"]]
        assert [v.shape for v in vectors] == [(32,), (32,)]
        assert all(abs(np.linalg.norm(v) - 1) < 1e-3 for v in vectors)
        assert not np.allclose(vectors[0], vectors[1])
