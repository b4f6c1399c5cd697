"""What a worker reads of an adapter's files before a leader attaches it, and of the weights its base serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opod.weights.tiny import write_tiny_llama
from opod.worker.adapter_files import read_adapter, weights_architecture
from opod.worker.refusals import AdapterRefused


def test_a_peft_directory_says_its_rank_base_and_architecture(tmp_path: Path) -> None:
    config = {
        "r": 8,
        "base_model_name_or_path": "meta-llama/Llama-3.2-1B",
        "auto_mapping": {"base_model_class": "LlamaForCausalLM", "parent_library": "transformers"},
    }
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    read = read_adapter("sql", str(tmp_path))
    assert (read.rank, read.base_model, read.architecture) == (8, "meta-llama/Llama-3.2-1B", "LlamaForCausalLM")


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        (None, "not found on this node"),
        ("file", "is a file; runtime LoRA takes a PEFT adapter directory"),
        ("empty", "has no adapter_config.json"),
        ("{not json", "adapter_config.json is not JSON"),
        ("[8]", "adapter_config.json is not a JSON object"),
        ('{"r": 0}', "gives no rank (r, a whole number above 0)"),
        ('{"r": true}', "gives no rank"),
    ],
)
def test_what_cannot_be_read_is_refused_naming_the_source(tmp_path: Path, layout: str | None, words: str) -> None:
    source = tmp_path / "adapter"
    if layout == "file":
        source.write_bytes(b"GGUF")
    elif layout is not None:
        source.mkdir()
        if layout != "empty":
            (source / "adapter_config.json").write_text(layout)
    with pytest.raises(AdapterRefused) as refused:
        read_adapter("a", str(source))
    assert refused.value.status == 400 and str(source) in str(refused.value) and words in str(refused.value)


def test_the_bases_architecture_is_read_from_its_weights(tmp_path: Path) -> None:
    assert weights_architecture(str(write_tiny_llama(tmp_path / "tiny.gguf"))) == "llama"
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    assert weights_architecture(str(model)) == "Qwen2ForCausalLM"
    assert weights_architecture("sim-model") == "" and weights_architecture(str(tmp_path / "none")) == ""
