"""Each dialect speaks its engine's wire: metric names and labels, health, and the extra endpoints."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import ENGINE_WIRE


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict, family: str, suffix: str = "", **labels: str) -> float:
    for s in fams[family].samples:
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no {family}{suffix} {labels}")


def chat(url: str, content: str = "hello", **extra: object) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "sim-model", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra},
    )


VLLM_NEEDED = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:cache_config_info",
    "vllm:request_success",
)


def test_vllm_metrics_have_vllm_names_labels_and_the_cache_config(sim) -> None:
    h = sim(kv_blocks=321, block_size=32, models=("smollm2",))
    assert chat(h.url).status_code == 404  # only smollm2 is served
    httpx.post(
        h.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    text = httpx.get(h.url + "/metrics").text
    fams = families(text)
    for name in VLLM_NEEDED:
        assert name in fams, name
    for fam in fams.values():
        # As in vLLM: admission rejections have no engine label, the cache config no model name.
        if fam.name.startswith("vllm:") and not fam.name.startswith("vllm:admission_rejections"):
            assert all(s.labels.get("engine") == "0" for s in fam.samples), fam.name
            if fam.name != "vllm:cache_config_info":
                assert all(s.labels.get("model_name") == "smollm2" for s in fam.samples), fam.name
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert (info["num_gpu_blocks"], info["block_size"]) == ("321", "32")
    assert sample(fams, "vllm:prompt_tokens", "_total") > 0
    assert sample(fams, "vllm:time_to_first_token_seconds", "_count") == 1
    assert 0.0 <= sample(fams, "vllm:kv_cache_usage_perc") <= 1.0
    if (ENGINE_WIRE / "vllm-metrics.txt").is_file():
        captured = families((ENGINE_WIRE / "vllm-metrics.txt").read_text())
        for name in VLLM_NEEDED:
            assert name in captured and captured[name].type == fams[name].type, name


def test_vllm_health_version_tokenize_and_detokenize(sim) -> None:
    h = sim()
    health = httpx.get(h.url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    assert httpx.get(h.url + "/version").json() == {"version": "0.32.0"}
    messages = [{"role": "user", "content": "Hello world, how are you?"}]
    tok = httpx.post(h.url + "/tokenize", json={"model": "sim-model", "messages": messages}).json()
    assert set(tok) == {"count", "max_model_len", "tokens", "token_strs"} and tok["count"] == len(tok["tokens"])
    used = chat(h.url, "Hello world, how are you?").json()["usage"]["prompt_tokens"]
    assert used == tok["count"]  # the prefix a router computes from /tokenize is the one the engine caches
    plain = httpx.post(
        h.url + "/tokenize", json={"prompt": "Hello world, how are you?", "return_token_strs": True}
    ).json()
    assert plain["count"] == 7 and "".join(plain["token_strs"]) == "Hello world, how are you?"
    back = httpx.post(h.url + "/detokenize", json={"model": "sim-model", "tokens": plain["tokens"]}).json()
    assert back == {"prompt": "Hello world, how are you?"}


def test_vllm_sleep_holds_requests_until_wake_up(sim) -> None:
    h = sim()
    assert httpx.post(h.url + "/sleep?level=1").json() == {"status": "sleeping", "level": 1}
    assert httpx.get(h.url + "/is_sleeping").json() == {"is_sleeping": True}
    assert httpx.get(h.url + "/health").status_code == 200
    fams = families(httpx.get(h.url + "/metrics").text)
    assert sample(fams, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1.0
    with httpx.Client(base_url=h.url) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/completions", json={"model": "sim-model", "prompt": "hi", "max_tokens": 2}, timeout=0.3)
        assert c.post("/wake_up").json()["status"] == "awake"
        assert (
            c.post("/v1/completions", json={"model": "sim-model", "prompt": "hi", "max_tokens": 2}).status_code == 200
        )
    assert httpx.get(h.url + "/is_sleeping").json() == {"is_sleeping": False}


def test_sglang_metrics_and_server_info(sim) -> None:
    h = sim(dialect="sglang", max_batch=7, block_size=8, kv_blocks=50)
    chat(h.url)
    fams = families(httpx.get(h.url + "/metrics").text)
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:max_total_num_tokens",
        "sglang:cache_hit_rate",
        "sglang:gen_throughput",
    ):
        labels = fams[name].samples[0].labels
        assert labels == {"engine_type": "unified", "model_name": "sim-model", "pp_rank": "0", "tp_rank": "0"}, name
    for name in (
        "sglang:prompt_tokens",
        "sglang:generation_tokens",
        "sglang:cached_tokens",
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
    ):
        assert fams[name].samples[0].labels.get("model_name") == "sim-model", name
    assert sample(fams, "sglang:max_total_num_tokens") == 400
    assert sample(fams, "sglang:prompt_tokens", "_total") > 0
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(h.url + path).json()
        assert (info["max_running_requests"], info["page_size"], info["max_total_num_tokens"]) == (7, 8, 400)
        assert info["status"] == "ready" and info["internal_states"][0]["running_batch_size"] == 0
    assert httpx.get(h.url + "/get_load").json()[0]["num_reqs"] == 0
    assert httpx.get(h.url + "/health").status_code == 200


def test_llamacpp_health_is_503_loading_model_then_ok(sim) -> None:
    h = sim(dialect="llamacpp", load_ms=400)
    first = httpx.get(h.url + "/health")
    assert first.status_code == 503
    assert first.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    assert chat(h.url).status_code == 503
    deadline = time.monotonic() + 5
    while httpx.get(h.url + "/health").status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(h.url + "/health").json() == {"status": "ok"}


def test_llamacpp_metrics_match_the_captured_family_names(sim) -> None:
    h = sim(dialect="llamacpp", max_batch=3)
    chat(h.url)
    text = httpx.get(h.url + "/metrics").text
    ours = families(text)
    assert {
        "llamacpp:prompt_tokens",
        "llamacpp:tokens_predicted",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
    } <= set(ours)
    assert all(not s.labels for f in ours.values() for s in f.samples)
    assert "_created" not in text
    if (ENGINE_WIRE / "llamacpp-metrics.txt").is_file():
        captured = (ENGINE_WIRE / "llamacpp-metrics.txt").read_text()
        names = lambda t: [line.split()[2] for line in t.splitlines() if line.startswith("# TYPE")]  # noqa: E731
        assert names(text) == names(captured)


def test_llamacpp_props_slots_tokenize_models_and_stream_shape(sim) -> None:
    h = sim(dialect="llamacpp", max_batch=2, max_model_len=2048)
    props = httpx.get(h.url + "/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 2048
    slots = httpx.get(h.url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and not any(s["is_processing"] for s in slots)
    tok = httpx.post(h.url + "/tokenize", json={"content": "Hello world"}).json()
    assert set(tok) == {"tokens"} and len(tok["tokens"]) == 2
    pieces = httpx.post(h.url + "/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert [p["piece"] for p in pieces] == ["Hello", " world"]
    assert httpx.post(h.url + "/detokenize", json={"tokens": tok["tokens"]}).json() == {"content": "Hello world"}
    models = httpx.get(h.url + "/v1/models").json()
    assert models["data"][0]["id"] == "sim-model" and models["models"][0]["name"] == "sim-model"
    assert httpx.get(h.url + "/models").json() == models
    missing = httpx.get(h.url + "/nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    raw = chat(h.url, stream=True, stream_options={"include_usage": True}).text
    bodies = [json.loads(r[6:]) for r in raw.split("\n\n") if r.startswith("data: {")]
    assert bodies[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert bodies[-2]["choices"][0]["delta"] == {} and bodies[-2]["choices"][0]["finish_reason"]
    assert (
        bodies[-1]["choices"] == []
        and "timings" in bodies[-1]
        and "cached_tokens" in bodies[-1]["usage"]["prompt_tokens_details"]
    )
    assert all(b["system_fingerprint"] for b in bodies)
    with openai.OpenAI(base_url=h.url + "/v1", api_key="x", max_retries=0) as c:
        assert (
            c.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            ).usage.completion_tokens
            <= 3
        )


def test_ollama_api_tags_ps_generate_keep_alive_chat_and_embed(sim) -> None:
    h = sim(dialect="ollama", models=("llama3.2", "qwen:7b"), embedding_dim=16)
    u = h.url
    assert httpx.get(u + "/").text == "Ollama is running"
    assert httpx.get(u + "/api/version").json()["version"]
    assert [m["name"] for m in httpx.get(u + "/api/tags").json()["models"]] == ["llama3.2:latest", "qwen:7b"]
    assert httpx.get(u + "/api/ps").json() == {"models": []}
    pinned = httpx.post(u + "/api/generate", json={"model": "llama3.2", "keep_alive": -1}).json()
    assert (pinned["done"], pinned["done_reason"]) == (True, "load")
    [loaded] = httpx.get(u + "/api/ps").json()["models"]
    assert loaded["name"] == "llama3.2:latest" and loaded["expires_at"] > "2200"
    out = httpx.post(
        u + "/api/generate",
        json={"model": "llama3.2", "prompt": "Why is the sky blue?", "stream": False, "options": {"num_predict": 5}},
    ).json()
    assert out["done"] and out["eval_count"] == 5 and out["done_reason"] == "length" and out["response"]
    assert out["prompt_eval_count"] > 0 and isinstance(out["total_duration"], int)
    unloaded = httpx.post(u + "/api/generate", json={"model": "llama3.2", "keep_alive": 0}).json()
    assert unloaded["done_reason"] == "unload" and httpx.get(u + "/api/ps").json() == {"models": []}
    r = httpx.post(
        u + "/api/chat",
        json={"model": "qwen:7b", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 3}},
    )
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert [x["done"] for x in lines] == [False, False, False, True]
    assert lines[-1]["message"]["content"] == "" and lines[-1]["eval_count"] == 3
    assert [m["name"] for m in httpx.get(u + "/api/ps").json()["models"]] == ["qwen:7b"]
    emb = httpx.post(u + "/api/embed", json={"model": "qwen:7b", "input": ["a", "b"]}).json()
    assert len(emb["embeddings"]) == 2 and len(emb["embeddings"][0]) == 16
    missing = httpx.post(u + "/api/chat", json={"model": "nope", "messages": []})
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
    with openai.OpenAI(base_url=u + "/v1", api_key="x", max_retries=0) as c:
        assert {m.id for m in c.models.list().data} == {"llama3.2:latest", "qwen:7b"}
        assert (
            c.chat.completions.create(
                model="llama3.2", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            ).usage.completion_tokens
            <= 2
        )
    assert httpx.get(u + "/metrics").status_code == 404  # Ollama has no Prometheus endpoint


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        (3600, 3600.0),
        (0, 0.0),
        ("0", 0.0),
        (-1, float("inf")),
        ("-1m", float("inf")),
    ],
)
def test_ollama_keep_alive_accepts_seconds_and_go_durations(value: object, seconds: float) -> None:
    from opod.sim.routes_ollama import parse_keep_alive

    assert parse_keep_alive(value) == seconds


def test_ollama_keep_alive_refuses_what_ollama_refuses(sim) -> None:
    h = sim(dialect="ollama")
    r = httpx.post(h.url + "/api/generate", json={"model": "sim-model", "prompt": "hi", "keep_alive": "3600"})
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]


def test_llamacpp_template_then_tokenize_counts_what_a_request_uses(sim) -> None:
    h = sim(dialect="llamacpp")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    prompt = httpx.post(h.url + "/apply-template", json={"messages": messages}).json()["prompt"]
    ids = httpx.post(h.url + "/tokenize", json={"content": prompt, "add_special": True, "parse_special": True}).json()[
        "tokens"
    ]
    used = httpx.post(
        h.url + "/v1/chat/completions", json={"model": "sim-model", "messages": messages, "max_tokens": 2}
    ).json()
    assert used["usage"]["prompt_tokens"] == len(ids) and ids.count(ids[0]) == 1  # one <s>, not two
    plain = httpx.post(h.url + "/tokenize", json={"content": "Once upon", "add_special": True}).json()["tokens"]
    done = httpx.post(
        h.url + "/v1/completions", json={"model": "sim-model", "prompt": "Once upon", "max_tokens": 2}
    ).json()
    assert done["usage"]["prompt_tokens"] == len(plain) == 3
