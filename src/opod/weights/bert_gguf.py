"""Writing a BERT encoder as a GGUF that ``llama-server --embeddings`` serves.

llama.cpp's BERT reads a WordPiece vocabulary in its "phantom space" form: a
word-initial piece carries the SPM marker ``▁`` in front, a continuation piece
(``##ing``) loses its ``##``, and the bracketed specials stay as they are. The
tensor names come from gguf's own table for the BERT architecture, so they are
exactly what llama.cpp looks up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gguf
import numpy as np

from opod.weights.errors import WeightsError
from opod.weights.files import atomic_path

SPACE = "\u2581"
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Not part of the encoder: the id table, and the pretraining heads.
_SKIPPED_PREFIXES = ("pooler.", "cls.", "bert.pooler.")
_SKIPPED = {"embeddings.position_ids", "bert.embeddings.position_ids"}
# Added to F32 activations: ggml refuses an F32 + F16 add, so these stay F32 in an F16 file.
_KEEP_F32 = {"position_embd.weight", "token_types.weight"}


@dataclass(frozen=True, slots=True)
class BertShape:
    hidden: int
    layers: int
    heads: int
    ff: int
    context: int
    layer_norm_eps: float
    type_vocab_size: int = 2


def phantom_vocab(wordpieces: list[str]) -> tuple[list[str], list[int]]:
    """WordPiece tokens → llama.cpp's WPM tokens and token types."""
    tokens: list[str] = []
    types: list[int] = []
    for piece in wordpieces:
        if piece in SPECIALS:
            tokens.append(piece)
            types.append(gguf.TokenType.CONTROL)
        elif piece.startswith("##"):
            tokens.append(piece[2:])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(SPACE + piece)
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def write_bert_gguf(
    path: Path,
    *,
    name: str,
    shape: BertShape,
    wordpieces: list[str],
    tensors: Mapping[str, np.ndarray],
    pooling: Literal["mean", "cls"] = "mean",
    f16: bool = True,
) -> Path:
    """Write the encoder (tensors named as in Hugging Face's BertModel) to ``path`` atomically."""
    ids = {piece: i for i, piece in enumerate(wordpieces)}
    missing = [s for s in SPECIALS if s not in ids]
    if missing:
        raise WeightsError(
            f"{name}: the vocabulary lacks {', '.join(missing)}; a BERT WordPiece vocab.txt has all five"
        )
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, shape.layers)
    mapped: list[tuple[str, np.ndarray]] = []
    for source_name, array in tensors.items():
        if source_name in _SKIPPED or source_name.startswith(_SKIPPED_PREFIXES):
            continue
        target = names.get_name(source_name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise WeightsError(f"{name}: tensor {source_name!r} has no place in llama.cpp's BERT; is this a BertModel?")
        data = np.ascontiguousarray(array, dtype=np.float32)
        if f16 and data.ndim == 2 and target not in _KEEP_F32:
            data = data.astype(np.float16)
        mapped.append((target, data))
    tokens, types = phantom_vocab(wordpieces)

    with atomic_path(Path(path)) as tmp:
        writer = gguf.GGUFWriter(tmp, "bert")
        writer.add_name(name)
        writer.add_context_length(shape.context)
        writer.add_embedding_length(shape.hidden)
        writer.add_feed_forward_length(shape.ff)
        writer.add_block_count(shape.layers)
        writer.add_head_count(shape.heads)
        writer.add_layer_norm_eps(shape.layer_norm_eps)
        writer.add_causal_attention(False)
        writer.add_pooling_type(gguf.PoolingType.MEAN if pooling == "mean" else gguf.PoolingType.CLS)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
        writer.add_tokenizer_model("bert")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_type_count(shape.type_vocab_size)
        writer.add_unk_token_id(ids["[UNK]"])
        writer.add_sep_token_id(ids["[SEP]"])
        writer.add_pad_token_id(ids["[PAD]"])
        writer.add_mask_token_id(ids["[MASK]"])
        # llama.cpp puts the BOS token first: for BERT that is [CLS]; [SEP] closes the sequence.
        writer.add_bos_token_id(ids["[CLS]"])
        writer.add_add_bos_token(True)
        writer.add_add_sep_token(True)
        writer.add_add_eos_token(False)
        for target, data in mapped:
            writer.add_tensor(target, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return Path(path)
