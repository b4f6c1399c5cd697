"""KV-cache cost per token, checked against values worked out by hand."""

from __future__ import annotations

from opod.catalog import load_catalog
from opod.catalog.kvcache import kv_cost
from opod.contract.catalog import Architecture

CATALOG = load_catalog([__import__("opod.catalog", fromlist=["bundled_dir"]).bundled_dir()])


def test_qwen2_5_half_billion_grouped_query_with_a_64_wide_head() -> None:
    # 2 (K and V) × 24 layers × 2 KV heads × 64 × 2 bytes = 12,288 bytes
    cost = kv_cost(CATALOG.get("qwen2.5-0.5b-gguf").architecture)
    assert cost.per_token == 12_288
    assert cost.kind == "gqa" and cost.notes == []
    assert cost.bytes_for(32_768) == 402_653_184  # 384 MiB


def test_gpt_oss_20b_half_of_the_layers_use_a_128_token_window() -> None:
    # per layer: 2 × 8 × 64 × 2 = 2,048 bytes; 24 layers = 49,152; 12 full layers = 24,576
    cost = kv_cost(CATALOG.get("gpt-oss-20b").architecture)
    assert (cost.per_token, cost.per_token_beyond_window, cost.window) == (49_152, 24_576, 128)
    # 12 × 2,048 × 131,072 + 12 × 2,048 × 128
    assert cost.bytes_for(131_072) == 3_224_371_200
    assert cost.bytes_for(100) == 4_915_200


def test_deepseek_r1_latent_attention_stores_one_576_wide_latent_per_layer() -> None:
    # 61 layers × (512 + 64) × 2 bytes = 70,272 bytes, with no K/V doubling
    cost = kv_cost(CATALOG.get("deepseek-r1-671b-sharded").architecture)
    assert cost.per_token == 70_272 and cost.kind == "mla"


def test_mistral_nemo_states_a_head_dim_that_differs_from_hidden_over_heads() -> None:
    # 2 × 40 × 8 × 128 × 2 = 163,840 bytes (160-wide heads would give 204,800)
    assert kv_cost(CATALOG.get("mistral-nemo-12b").architecture).per_token == 163_840


def test_unknown_fields_warn_and_never_refuse() -> None:
    unknown = kv_cost(CATALOG.get("gemma4-12b").architecture)
    assert unknown.per_token is None and unknown.bytes_for(10) is None
    assert unknown.notes == ["layers not stated: KV-cache size unknown"]
    assumed = kv_cost(Architecture(layers=32, heads=32, kv_heads=8))
    assert assumed.per_token == 131_072
    assert assumed.notes == ["head_dim not stated: assumed 128"]
    assert kv_cost(Architecture(layers=32)).notes == ["kv_heads not stated: KV-cache size unknown"]
