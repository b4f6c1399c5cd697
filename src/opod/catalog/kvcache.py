"""KV-cache cost per token, computed from a catalog entry's architecture.

Per layer and token an attention layer keeps a key and a value per KV head:
``2 × kv_heads × head_dim`` elements. Multi-head latent attention keeps one
latent of ``kv_lora_rank + qk_rope_head_dim`` elements instead. Sliding-window
layers stop growing once the context passes the window. Unknown (zero) fields
give an unknown cost with a note saying why, never a refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opod.contract.catalog import Architecture

DEFAULT_HEAD_DIM = 128
"""What the catalog assumes when an entry does not state its head dimension."""

FP16_BYTES = 2


@dataclass(frozen=True, slots=True)
class KVCost:
    """Bytes of KV cache per token; ``None`` when the architecture does not say enough."""

    per_token: int | None
    """All layers, while the context is within every window."""
    per_token_beyond_window: int | None
    """Only the layers that keep growing once the context passes ``window``."""
    window: int = 0
    kind: str = "unknown"
    notes: list[str] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return self.per_token is not None

    def bytes_for(self, tokens: int) -> int | None:
        """Cache size for one sequence of ``tokens`` tokens."""
        if self.per_token is None or self.per_token_beyond_window is None:
            return None
        if not self.window:
            return self.per_token * tokens
        within = min(tokens, self.window)
        return self.per_token * within + self.per_token_beyond_window * (tokens - within)


def kv_cost(arch: Architecture, element_bytes: int = FP16_BYTES) -> KVCost:
    """The KV-cache cost of one token for a model of this architecture."""
    notes: list[str] = []
    if not arch.layers:
        return KVCost(None, None, notes=["layers not stated: KV-cache size unknown"])
    if arch.kv_lora_rank:
        width = arch.kv_lora_rank + arch.qk_rope_head_dim
        if not arch.qk_rope_head_dim:
            notes.append("qk_rope_head_dim not stated: counted as 0")
        per_layer = width * element_bytes
        kind = "mla"
    else:
        if not arch.kv_heads:
            return KVCost(None, None, notes=["kv_heads not stated: KV-cache size unknown"])
        head_dim = arch.head_dim
        if not head_dim:
            head_dim = DEFAULT_HEAD_DIM
            notes.append(f"head_dim not stated: assumed {DEFAULT_HEAD_DIM}")
        per_layer = 2 * arch.kv_heads * head_dim * element_bytes
        kind = "gqa" if arch.heads and arch.kv_heads < arch.heads else "mha"
    sliding = arch.sliding_window_layers if arch.sliding_window else 0
    full = arch.layers * per_layer
    beyond = (arch.layers - sliding) * per_layer
    return KVCost(full, beyond, window=arch.sliding_window if sliding else 0, kind=kind, notes=notes)
