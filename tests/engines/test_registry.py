"""The driver table: names, aliases, the capabilities rows, and the refusal for an unknown engine."""

from __future__ import annotations

import json

import pytest

from opod.contract.adminapi import Capabilities
from opod.engines import registry
from opod.engines.errors import UnknownEngine
from opod.engines.llamacpp import LlamaCppDriver


def test_ids_and_aliases_resolve() -> None:
    expected = {
        "llamacpp": "llamacpp",
        "llama-cpp": "llamacpp",
        "llamacpp-rpc": "llamacpp",
        "vllm": "vllm",
        "sglang": "sglang",
        "sgl": "sglang",
        "ollama": "ollama",
        "sim": "sim",
        " VLLM ": "vllm",
    }
    for name, engine in expected.items():
        assert registry.get_driver(name).id == engine


def test_unknown_engine_names_every_known_one() -> None:
    with pytest.raises(UnknownEngine) as err:
        registry.get_driver("tensorrt")
    assert str(err.value) == (
        "unknown engine 'tensorrt'; known engines: llamacpp (llama-cpp, llamacpp-rpc), ollama, sglang (sgl), sim, vllm"
    )
    assert isinstance(err.value, LookupError) and err.value.name == "tensorrt"
    assert registry.UnknownEngine is UnknownEngine


def test_engine_infos_are_sorted_and_encode_like_the_contract() -> None:
    rows = registry.engine_infos()
    assert [r.id for r in rows] == sorted(r.id for r in rows) == [d.id for d in registry.all_drivers()]
    assert json.loads(Capabilities(engines=rows).to_json())["engines"] == [
        {"id": "llamacpp", "aliases": ["llama-cpp", "llamacpp-rpc"], "native": "path"},
        {"id": "ollama", "native": "ollama_name"},
        {"id": "sglang", "aliases": ["sgl"], "native": "repo"},
        {"id": "sim", "native": "id"},
        {"id": "vllm", "native": "repo"},
    ]


def test_a_name_claimed_twice_is_refused_at_import() -> None:
    class Twin(LlamaCppDriver):
        id = "twin"
        aliases = ("sgl",)

    with pytest.raises(RuntimeError, match="'sgl' is claimed by both"):
        registry._index((*registry.DRIVERS, Twin()))
