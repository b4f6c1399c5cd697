"""A tiny random-weight llama GGUF for tests: no download, built in well under a second.

What llama.cpp needs from such a file, and how this one meets it:

- the llama architecture keys (context, width, layers, heads, rope, RMS eps);
- an SPM vocabulary that holds every ``<0xNN>`` byte token, because SPM falls
  back to bytes for anything its pieces do not cover (a newline is ``<0x0A>``);
- a chat template (ChatML), whose markers are control tokens;
- the usual tensors; numpy shapes are ggml's ``ne`` reversed, so a projection
  from ``n_embd`` to ``n_out`` is ``(n_out, n_embd)``.

Generation is always printable text: the output rows of every non-normal token
(control, byte, unknown) are zero while normal pieces get large random logits,
so no control token and no lone byte ever wins. The same seed and shape give a
byte-identical file, so a test can pin a digest or an exact completion.

A model that ``says`` a word answers every prompt with that word, repeated: every token's
embedding is one vector and no block adds to it, so the last hidden state is the same whatever
was asked, and the word's output row points along it. Two such files make a good model and a
worse one for quality checks that must tell them apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from opod.weights.files import atomic_path

SPACE = "\u2581"
"""SPM's word-start marker: a piece beginning with it starts a new word."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Words the test prompts use, so they tokenize into whole pieces rather than letters.
WORDS: tuple[str, ...] = tuple(
    """
    a an and are as at be but by can chat come day do each engine fleet for from gateway go good
    has have health hello her here his how i if in into is it its just key know last let like load
    look make many metric model more most my name new no node not now of on one only or other our
    out over people pod proxy queue ready reply request route say see server she slot so some stream
    take test than that the their them then there they this time to token two up us use want was way
    we well what when which who will with word work world would year yes you your
    """.split()
)

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@dataclass(frozen=True, slots=True)
class TinyVocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]

    def id(self, token: str) -> int:
        return self.tokens.index(token)

    @property
    def normal(self) -> np.ndarray:
        return np.array([t == gguf.TokenType.NORMAL for t in self.types])


def tiny_vocab(words: Iterable[str] = WORDS) -> TinyVocab:
    """Specials, the 256 byte tokens, ASCII characters, then every prefix of each ``▁word``.

    Every prefix is present because SPM builds a word by merging adjacent pieces,
    and a merge needs its result in the vocabulary; longer pieces score higher so
    whole words win.
    """
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    seen: set[str] = set()

    def add(text: str, score: float, kind: int) -> None:
        if text not in seen:
            seen.add(text)
            tokens.append(text)
            scores.append(score)
            types.append(kind)

    add(UNK, 0.0, gguf.TokenType.UNKNOWN)
    add(BOS, 0.0, gguf.TokenType.CONTROL)
    add(EOS, 0.0, gguf.TokenType.CONTROL)
    for byte in range(256):
        add(f"<0x{byte:02X}>", 0.0, gguf.TokenType.BYTE)
    add(IM_START, 0.0, gguf.TokenType.CONTROL)
    add(IM_END, 0.0, gguf.TokenType.CONTROL)
    add(SPACE, -1.0, gguf.TokenType.NORMAL)
    for code in range(0x21, 0x7F):
        add(chr(code), -1.0, gguf.TokenType.NORMAL)
    for word in words:
        piece = SPACE + word
        for end in range(2, len(piece) + 1):
            add(piece[:end], float(end), gguf.TokenType.NORMAL)
    return TinyVocab(tokens, scores, types)


def write_tiny_llama(
    path: Path | str,
    *,
    seed: int = 0,
    layers: int = 2,
    dim: int = 64,
    heads: int = 4,
    kv_heads: int | None = None,
    ff: int = 192,
    context: int = 2048,
    name: str = "opod-tiny-llama",
    says: str | None = None,
) -> Path:
    """Write a tiny llama GGUF to ``path`` (atomically) and return the path.

    The default file is about 0.8 MB with a 400-odd token vocabulary; llama-server
    is healthy a few tens of milliseconds after it starts.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    for field, value in (
        ("layers", layers),
        ("dim", dim),
        ("heads", heads),
        ("kv_heads", kv_heads),
        ("ff", ff),
        ("context", context),
    ):
        if value <= 0:
            raise ValueError(f"write_tiny_llama: {field} must be > 0, got {value}")
    if dim % heads or heads % kv_heads:
        raise ValueError(
            f"write_tiny_llama: dim ({dim}) must divide by heads ({heads}), and heads by kv_heads ({kv_heads})"
        )
    head_dim = dim // heads
    if head_dim % 2:
        raise ValueError(f"write_tiny_llama: dim/heads must be even for rope, got {head_dim}")

    vocab = tiny_vocab()
    n_vocab = len(vocab.tokens)
    if says is not None and SPACE + says not in vocab.tokens:
        raise ValueError(
            f"write_tiny_llama: says must be one of the vocabulary's words ({', '.join(WORDS[:8])}, …), not {says!r}"
        )
    rng = np.random.default_rng(seed)

    def random(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    ones = np.ones(dim, dtype=np.float32)
    embeddings = random(n_vocab, dim, 1.0)
    output = random(n_vocab, dim, 3.0)
    # Zero logits for control, byte and unknown tokens; normal pieces get large ones, so they always win.
    output[~vocab.normal] = 0.0
    if says is not None:
        embeddings[:] = embeddings[0]
        direction = embeddings[0] / np.linalg.norm(embeddings[0])
        output[vocab.id(SPACE + says)] = direction * 1000.0
    tensors: list[tuple[str, np.ndarray]] = [("token_embd.weight", embeddings)]
    tensors += [("output_norm.weight", ones), ("output.weight", output)]
    kv_dim = kv_heads * head_dim
    for i in range(layers):
        block = f"blk.{i}."
        tensors += [
            (block + "attn_norm.weight", ones),
            (block + "attn_q.weight", random(dim, dim, 0.2)),
            (block + "attn_k.weight", random(kv_dim, dim, 0.2)),
            (block + "attn_v.weight", random(kv_dim, dim, 0.2)),
            (block + "attn_output.weight", random(dim, dim, 0.2) * (says is None)),
            (block + "ffn_norm.weight", ones),
            (block + "ffn_gate.weight", random(ff, dim, 0.2)),
            (block + "ffn_up.weight", random(ff, dim, 0.2)),
            (block + "ffn_down.weight", random(dim, ff, 0.2) * (says is None)),
        ]

    target = Path(path)
    with atomic_path(target) as tmp:
        writer = gguf.GGUFWriter(tmp, "llama")
        writer.add_name(name)
        writer.add_context_length(context)
        writer.add_embedding_length(dim)
        writer.add_block_count(layers)
        writer.add_feed_forward_length(ff)
        writer.add_head_count(heads)
        writer.add_head_count_kv(kv_heads)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(n_vocab)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(vocab.tokens)
        writer.add_token_scores(vocab.scores)
        writer.add_token_types(vocab.types)
        writer.add_unk_token_id(vocab.id(UNK))
        writer.add_bos_token_id(vocab.id(BOS))
        writer.add_eos_token_id(vocab.id(EOS))
        writer.add_eot_token_id(vocab.id(IM_END))
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_add_space_prefix(True)
        writer.add_chat_template(CHATML_TEMPLATE)
        for tensor_name, array in tensors:
            writer.add_tensor(tensor_name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return target
