"""Whether an adapter fits its model: the rule the leader applies to what a worker read of the adapter's files."""

from __future__ import annotations

import pytest

from opod.catalog.adapters import architecture_key, load_adapters, misfit, repositories
from opod.contract.admin.catalog import CatalogAdapter, CatalogModel, CatalogOrigin
from opod.contract.nodeapi import AdapterFacts

MODEL = CatalogModel(name="llama-1b", source="hf:meta-llama/Llama-3.2-1B-Instruct")


def facts(**given: object) -> AdapterFacts:
    return AdapterFacts.model_validate({"name": "a", "source": "/x", "rank": 8, "max_rank": 16, **given})


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"rank": 32}, "its rank is 32, above the 16 the engine serving llama-1b takes (max_lora_rank)"),
        (
            {"architecture": "Qwen2ForCausalLM", "base_architecture": "llama"},
            "trained for the Qwen2ForCausalLM architecture, but llama-1b serves llama weights",
        ),
        (
            {"base_model": "Qwen/Qwen2.5-0.5B"},
            "trained on Qwen/Qwen2.5-0.5B, not on llama-1b's weights (meta-llama/Llama-3.2-1B-Instruct)",
        ),
    ],
)
def test_a_stated_mismatch_is_refused_with_the_numbers_and_the_names(given: dict[str, object], words: str) -> None:
    assert words in misfit(MODEL, facts(**given))


@pytest.mark.parametrize(
    "given",
    [
        {"rank": 16},
        {"base_model": "meta-llama/Llama-3.2-1B-Instruct"},
        {"base_model": "unsloth/llama-3.2-1b-instruct"},  # a mirror of the same weights
        {"architecture": "LlamaForCausalLM", "base_architecture": "llama"},  # PEFT's word and a GGUF's
        {"architecture": "LlamaForCausalLM"},  # the base's own architecture unknown: not held against it
        {"base_model": ""},
    ],
)
def test_what_fits_or_is_not_known_is_let_through(given: dict[str, object]) -> None:
    assert misfit(MODEL, facts(**given)) == ""


def test_a_model_from_a_local_file_names_no_repository_to_compare_with() -> None:
    local = CatalogModel(name="local", source="/models/llama-1b.Q4_K_M.gguf")
    assert repositories(local) == []
    assert misfit(local, facts(base_model="anything/else")) == ""
    moved = local.model_copy(update={"origin": CatalogOrigin(repo="acme/llama-1b-GGUF")})
    assert repositories(moved, "acme/base") == ["acme/llama-1b-GGUF", "acme/base"]
    assert "not on local's weights" in misfit(moved, facts(base_model="other/thing"))


def test_architecture_names_are_compared_by_their_family() -> None:
    assert architecture_key("LlamaForCausalLM") == architecture_key("llama") == "llama"
    assert architecture_key("Gemma3ForConditionalGeneration") == "gemma3"
    assert architecture_key("GPT2LMHeadModel") == "gpt2"
    assert architecture_key("qwen2") != architecture_key("Qwen3ForCausalLM")


def test_a_load_request_carries_the_definitions_adapters() -> None:
    assert load_adapters(None) is None and load_adapters(MODEL) is None
    listed = MODEL.model_copy(update={"adapters": [CatalogAdapter(name="sql", source="/a/sql", owner="org:1")]})
    assert [a.to_wire() for a in load_adapters(listed) or []] == [{"name": "sql", "source": "/a/sql"}]
