"""vLLM's runtime LoRA API in the simulator: load, list, answer under the adapter's name, cache apart, unload."""

from __future__ import annotations

import httpx
import pytest

from opod.sim import SimConfig, SimConfigError, running

CONFIG = SimConfig(port=0, models=("base",), time_scale=0.0, block_size=16, enable_lora=True)
SYSTEM = " ".join(f"rule{i}." for i in range(100))


def chat(url: str, model: str) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_an_adapter_is_loaded_listed_answered_and_unloaded_as_vllm_does() -> None:
    with running(CONFIG) as sim:
        r = httpx.post(sim.url + "/v1/load_lora_adapter", json={"lora_name": "base:sql", "lora_path": "/a/sql"})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'base:sql' added successfully.")
        again = httpx.post(sim.url + "/v1/load_lora_adapter", json={"lora_name": "base:sql", "lora_path": "/a/sql"})
        assert (
            again.status_code == 400
            and again.json()["error"]["message"] == "The lora adapter 'base:sql' has already been loaded."
        )
        cards = {m["id"]: m for m in httpx.get(sim.url + "/v1/models").json()["data"]}
        assert (cards["base:sql"]["root"], cards["base:sql"]["parent"], cards["base"]["parent"]) == (
            "/a/sql",
            "base",
            None,
        )
        assert chat(sim.url, "base:sql")["model"] == "base:sql"

        r = httpx.post(sim.url + "/v1/unload_lora_adapter", json={"lora_name": "base:sql"})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'base:sql' removed successfully.")
        gone = httpx.post(sim.url + "/v1/unload_lora_adapter", json={"lora_name": "base:sql"})
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "NotFoundError"
        assert (
            httpx.post(
                sim.url + "/v1/chat/completions",
                json={"model": "base:sql", "messages": [{"role": "user", "content": "x"}]},
            ).status_code
            == 404
        )
        missing = httpx.post(sim.url + "/v1/load_lora_adapter", json={"lora_name": "x"})
        assert missing.status_code == 400 and "lora_path" in missing.json()["error"]["message"]


def test_an_adapter_does_not_reuse_the_base_models_cached_prefix() -> None:
    with running(CONFIG) as sim:
        httpx.post(
            sim.url + "/v1/load_lora_adapter", json={"lora_name": "base:sql", "lora_path": "/a/sql"}
        ).raise_for_status()
        chat(sim.url, "base")
        assert cached(chat(sim.url, "base")) > 0
        assert cached(chat(sim.url, "base:sql")) == 0
        assert cached(chat(sim.url, "base:sql")) > 0


def test_without_enable_lora_there_is_no_lora_api() -> None:
    with running(SimConfig(port=0, models=("base",), time_scale=0.0)) as sim:
        assert (
            httpx.post(sim.url + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/a"}).status_code == 404
        )
    with pytest.raises(SimConfigError, match="--enable-lora is vLLM's runtime LoRA API; the sglang dialect has none"):
        with running(SimConfig(port=0, dialect="sglang", enable_lora=True)):
            pass
