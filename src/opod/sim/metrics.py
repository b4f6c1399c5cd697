"""``/metrics`` for the vLLM and SGLang dialects, with those engines' names, labels and buckets.

Both engines expose through ``prometheus_client``, so the simulator does too:
a collector reads the engine's plain counters at scrape time, and the request
path never touches a Prometheus object.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from opod.sim.engine import Engine
from opod.sim.stats import FINISH_REASONS, Histogram

__all__ = ["CONTENT_TYPE", "SGLangCollector", "VLLMCollector", "registry_for", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _hist(
    name: str, doc: str, labels: list[str], values: list[str], h: Histogram, created: float | None
) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    fam.add_metric(values, [(floatToGoString(b), float(c)) for b, c in h.cumulative()], h.sum)
    if created is not None:
        fam.samples.append(Sample(name + "_created", dict(zip(labels, values)), created))
    return fam


class VLLMCollector(Collector):
    """vLLM 0.32's ``vllm:*`` families; every series labelled ``engine="0"`` and ``model_name``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        s = e.stats
        cfg = e.cfg
        t0 = s.created
        L = ["engine", "model_name"]
        V = ["0", cfg.model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=L)
            g.add_metric(V, float(value))
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=L)
            c.add_metric(V, float(value), created=t0)
            return c

        def by(name: str, doc: str, label: str, values: dict[str, float], kind: type = CounterMetricFamily) -> Metric:
            labels = sorted([*L, label])
            fam = kind(name, doc, labels=labels)
            for key, value in values.items():
                row = dict(zip(L, V), **{label: key})
                if kind is CounterMetricFamily:
                    fam.add_metric([row[n] for n in labels], float(value), created=t0)
                else:
                    fam.add_metric([row[n] for n in labels], float(value))
            return fam

        waiting = e.waiting
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", e.running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        yield by(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason.",
            "reason",
            {"capacity": waiting, "deferred": 0},
            GaugeMetricFamily,
        )
        level = e.sleep_level
        yield by(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            "sleep_state",
            {"awake": level == 0, "weights_offloaded": level == 1, "discard_all": level >= 2},
            GaugeMetricFamily,
        )
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv_usage)
        hits, prompt = s.cached_tokens, s.prompt_tokens
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", prompt
        )
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", hits)
        for name in (
            "external_prefix_cache_queries",
            "external_prefix_cache_hits",
            "mm_cache_queries",
            "mm_cache_hits",
            "num_preemptions",
        ):
            yield counter(f"vllm:{name}", f"{name.replace('_', ' ').capitalize()} (always 0 in the simulator).", 0)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt)
        yield by(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            {"local_compute": prompt - hits, "local_cache_hit": hits, "external_kv_transfer": 0},
        )
        yield counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", hits)
        yield by(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them.",
            "source",
            {"device": hits, "host": 0, "p2p": 0, "disk": 0, "external_unspecified": 0},
        )
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens)
        yield by(
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            {r: s.finished.get(r, 0) for r in FINISH_REASONS},
        )
        rejections = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.add_metric([cfg.model, reason], 0.0, created=t0)
        yield rejections
        for name, doc, h in (
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", s.prompt_len),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.", s.gen_len),
            (
                "vllm:request_max_num_generation_tokens",
                "Histogram of maximum number of requested generation tokens.",
                s.max_tokens,
            ),
            ("vllm:request_params_n", "Histogram of the n request parameter.", s.params_n),
            ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", s.max_tokens),
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl),
            (
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                s.tpot,
            ),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e),
            ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", s.queue),
            (
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                s.inference,
            ),
            ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", s.prefill),
            ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", s.decode),
            (
                "vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                s.prefill_computed,
            ),
        ):
            yield _hist(name, doc, L, V, h, t0)
        info = {
            "block_size": str(cfg.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "engine": "0",
            "gpu_memory_utilization": "0.92",
            "kv_cache_max_concurrency": str(round(cfg.kv_blocks * cfg.block_size / cfg.max_model_len, 2)),
            "kv_cache_size_tokens": str(cfg.kv_blocks * cfg.block_size),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(cfg.kv_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
            "user_specified_block_size": "True",
        }
        g = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(info))
        g.add_metric(list(info.values()), 1.0)
        yield g


class SGLangCollector(Collector):
    """SGLang's ``sglang:*`` families: scheduler gauges carry engine_type/tp_rank/pp_rank, the rest ``model_name``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._last = (time.monotonic(), 0)

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        s = e.stats
        cfg = e.cfg
        GL = ["engine_type", "model_name", "pp_rank", "tp_rank"]
        GV = ["unified", cfg.model, "0", "0"]
        now = time.monotonic()
        then, tokens_then = self._last
        self._last = (now, s.generation_tokens)
        throughput = (s.generation_tokens - tokens_then) / (now - then) if now > then else 0.0
        capacity = cfg.kv_blocks * cfg.block_size
        for name, doc, value in (
            ("sglang:num_running_reqs", "The number of running requests.", e.running),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", e.waiting),
            ("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0),
            ("sglang:num_used_tokens", "The number of used tokens.", e.cache.held * cfg.block_size),
            ("sglang:token_usage", "The token usage.", e.kv_usage),
            ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", capacity),
            ("sglang:gen_throughput", "The generation throughput (token/s).", throughput),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", s.last_hit_rate),
        ):
            g = GaugeMetricFamily(name, doc, labels=GL)
            g.add_metric(GV, float(value))
            yield g
        L, V = ["model_name"], [cfg.model]
        for name, doc, value in (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens),
            ("sglang:generation_tokens", "Number of generation tokens processed.", s.generation_tokens),
            ("sglang:cached_tokens", "Number of cached prompt tokens.", s.cached_tokens),
            ("sglang:num_requests", "Number of requests processed.", sum(s.finished.values())),
            ("sglang:num_so_requests", "Number of structured output requests processed.", 0),
            ("sglang:num_aborted_requests", "Number of requests aborted.", s.finished.get("abort", 0)),
        ):
            c = CounterMetricFamily(name, doc, labels=L)
            c.add_metric(V, float(value))
            yield c
        for name, doc, h in (
            ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft),
            ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl),
            ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", s.e2e),
        ):
            yield _hist(name, doc, L, V, h, None)


def registry_for(collector: Collector, with_process: bool = True) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    if with_process:
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
    reg.register(collector)
    return reg


def render(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
