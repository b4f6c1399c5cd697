"""MiniLM → GGUF: llama-server's embeddings of the converted file match BERT computed from the original weights."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from opod.weights import WeightsError
from opod.weights.minilm import convert
from opod.weights.safetensors import read_safetensors
from tests.support import llama_server
from tests.support.bert_reference import BertEncoder

SENTENCES = [
    "This is a test sentence.",
    "The quick brown fox jumps over the lazy dog!",
    "opod routes each request to the worker best placed to answer it.",
    "Café crème, naïve résumé: déjà vu.",
    "How many GPUs does the fleet have in 2026?",
]


@pytest.fixture(scope="module")
def converted(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(minilm_dir, tmp_path_factory.mktemp("minilm") / "minilm-f16.gguf")


def test_conversion_is_deterministic_and_keeps_every_weight(converted: Path, minilm_dir: Path, tmp_path: Path) -> None:
    again = convert(minilm_dir, tmp_path / "again.gguf")
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(converted.read_bytes()).digest()
    reader = gguf.GGUFReader(converted)
    assert reader.fields["general.architecture"].contents() == "bert"
    assert reader.fields["bert.pooling_type"].contents() == gguf.PoolingType.MEAN
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 30522
    tensors = {t.name: t for t in reader.tensors}
    original = read_safetensors(minilm_dir / "model.safetensors")
    # Everything but the position-id table and the pretraining pooler, which mean pooling does not use.
    kept = [n for n in original if n != "embeddings.position_ids" and not n.startswith("pooler.")]
    assert len(tensors) == len(kept)
    # Matrices are F16, except the position and token-type tables that ggml adds to F32 activations.
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["position_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    query = np.asarray(tensors["blk.0.attn_q.weight"].data, dtype=np.float32).reshape(384, 384)
    assert np.abs(query - original["encoder.layer.0.attention.self.query.weight"]).max() < 1e-3


def test_a_directory_that_is_not_a_bert_model_is_refused_by_name(minilm_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="missing config.json, vocab.txt, model.safetensors"):
        convert(tmp_path, tmp_path / "out.gguf")
    fake = tmp_path / "fake"
    shutil.copytree(minilm_dir, fake)
    config = json.loads((fake / "config.json").read_text())
    (fake / "config.json").write_text(
        json.dumps({**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    with pytest.raises(WeightsError, match="only BERT encoders"):
        convert(fake, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.engine
def test_llama_server_embeddings_match_the_numpy_reference(converted: Path, minilm_dir: Path) -> None:
    reference = BertEncoder(minilm_dir)
    with llama_server.running(converted, "--embeddings", "--pooling", "mean", alias="minilm") as base:
        answer = llama_server.post_json(base + "/v1/embeddings", {"model": "minilm", "input": SENTENCES})
        for sentence, item in zip(SENTENCES, sorted(answer["data"], key=lambda d: d["index"])):
            served = np.array(item["embedding"])
            assert served.shape == (384,)
            expected = reference.embed(sentence)
            cosine = float(served @ expected / np.linalg.norm(served))
            assert cosine >= 0.999, f"{sentence!r}: cosine {cosine:.5f} against the reference"
            # The converted vocabulary tokenizes exactly as BERT's WordPiece does.
            served_ids = llama_server.post_json(base + "/tokenize", {"content": sentence, "add_special": True})[
                "tokens"
            ]
            assert served_ids == reference.tokenizer.encode(sentence)
        # Different sentences stay apart: the vectors carry meaning, not a constant.
        first, second = (np.array(d["embedding"]) for d in answer["data"][:2])
        assert first @ second / (np.linalg.norm(first) * np.linalg.norm(second)) < 0.9
