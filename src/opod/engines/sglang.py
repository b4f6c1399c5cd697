"""SGLang's server (``python -m sglang.launch_server``): one model per process, GPU only.

Wire facts this driver relies on (from SGLang's source and docs; it was not run):

- ``/metrics`` only with ``--enable-metrics``; scheduler gauges carry
  ``tp_rank``/``pp_rank`` (and ``dp_rank``), so a gauge is read from TP and PP
  rank 0 and summed over DP ranks; ``token_usage`` is a fraction 0..1;
  ``cache_hit_rate`` describes only the last prefill batch, so the prefix hit
  rate comes from ``cached_tokens_total`` over ``prompt_tokens_total`` (which
  includes the cached ones) and the gauge is only a fallback;
- ``/server_info`` (older releases: ``/get_server_info``) holds the server args
  and, per DP rank, ``internal_states`` with the effective ``max_running_requests``.
"""

from __future__ import annotations

import json
import sys
import time

import aiohttp

from opod.engines import flags as fl
from opod.engines import promtext
from opod.engines.base import EngineDriver, LaunchSpec, LoadSample, MetricsState
from opod.engines.enginehttp import try_json

P = "sglang:"
_GEN, _CACHED, _PROMPT = P + "generation_tokens_total", P + "cached_tokens_total", P + "prompt_tokens_total"


def _rank0(labels: promtext.Labels) -> bool:
    # Without --enable-metrics-for-all-schedulers only rank 0 reports; with it, other TP ranks repeat the same requests.
    return labels.get("tp_rank", "0") == "0" and labels.get("pp_rank", "0") == "0"


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class SglangDriver(EngineDriver):
    id = "sglang"
    aliases = ("sgl",)
    native = "repo"
    dialect = "sglang"
    flag_keys = frozenset(
        {
            "tp",
            "pp",
            "dp",
            "ctx",
            "max_model_len",
            "max_running_requests",
            "np",
            "mem_fraction_static",
            "kv_cache_dtype",
            "trust_remote_code",
            "page_size",
            "extra",
        }
    )
    reserved = frozenset(
        {
            "--model-path",
            "--model",
            "--served-model-name",
            "--host",
            "--port",
            "--kv-events-config",
            "--tool-call-parser",
        }
    )
    module = "sglang.launch_server"

    def argv(self, spec: LaunchSpec) -> list[str]:
        """``python -m sglang.launch_server --model-path M --served-model-name ID --host --port --enable-metrics`` + plan flags.

        ``spec.binary`` is the Python interpreter of the environment SGLang is installed in.
        """
        fl.check_spec(spec)
        f = spec.flags
        prefix = list(spec.launcher) or [spec.binary or sys.executable, "-m", self.module]
        out = prefix + [
            "--model-path",
            spec.model,
            "--served-model-name",
            spec.model_id,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--enable-metrics",
        ]
        ctx = fl.int_flag(f, "max_model_len", minimum=1) or fl.int_flag(f, "ctx", minimum=1) or spec.context
        if ctx:
            out += ["--context-length", str(ctx)]
        running = fl.int_flag(f, "max_running_requests", minimum=1) or fl.int_flag(f, "np", minimum=1) or spec.parallel
        if running:
            out += ["--max-running-requests", str(running)]
        for key, flag in (("tp", "--tp-size"), ("pp", "--pp-size"), ("dp", "--dp-size"), ("page_size", "--page-size")):
            value = fl.int_flag(f, key, minimum=1)
            if value:
                out += [flag, str(value)]
        frac = fl.float_flag(f, "mem_fraction_static", low=0.0, high=1.0)
        if frac is not None:
            out += ["--mem-fraction-static", f"{frac:g}"]
        dtype = fl.str_flag(f, "kv_cache_dtype")
        if dtype:
            out += ["--kv-cache-dtype", dtype]
        if fl.bool_flag(f, "trust_remote_code"):
            out += ["--trust-remote-code"]
        if spec.embeddings or spec.rerank:
            out += ["--is-embedding"]
        if spec.rerank:
            out += ["--disable-radix-cache"]  # cross-encoder scoring shares no prefixes worth caching
        if spec.kv_events_endpoint:
            config = {"publisher": "zmq", "endpoint": spec.kv_events_endpoint, "topic": "kv-events"}
            out += ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
        if spec.tool_call_parser and not (spec.embeddings or spec.rerank):
            out += ["--tool-call-parser", spec.tool_call_parser]
        return out + fl.extra_args(f, self.reserved)

    def parse_metrics(
        self, text: str, previous: MetricsState | None, now: float | None = None
    ) -> tuple[LoadSample, MetricsState]:
        now = time.time() if now is None else now
        scrape = promtext.Scrape(text, self.id)
        counters = {name: v for name in (_GEN, _CACHED, _PROMPT) if (v := scrape.total(name)) is not None}
        slots = previous.slots if previous else None
        rate = promtext.counter_rate(_GEN, counters, previous, now)
        if rate is None:  # first scrape or a restart: SGLang's own recent-throughput gauge is the best reading
            rate = scrape.total(P + "gen_throughput", _rank0)
        hit = promtext.counter_share(_CACHED, _PROMPT, counters, previous)
        if hit is None and _CACHED not in counters:
            hit = promtext.loose_pct(scrape.mean(P + "cache_hit_rate", _rank0))
        sample = LoadSample(
            sampled_at=now,
            kv_used_pct=promtext.fraction_to_pct(
                scrape.first_mean((P + "token_usage", P + "kv_cache_usage_perc"), _rank0)
            ),
            queue_depth=promtext.as_count(
                scrape.first_total((P + "num_queue_reqs", P + "num_requests_waiting"), _rank0)
            ),
            running=promtext.as_count(scrape.first_total((P + "num_running_reqs", P + "num_requests_running"), _rank0)),
            tokens_per_s=rate,
            prefix_hit_pct=hit,
            slots=slots,
        )
        return sample, MetricsState(at=now, counters=counters, slots=slots)

    async def slots(self, session: aiohttp.ClientSession, base_url: str, spec: LaunchSpec | None = None) -> int | None:
        """The effective ``max_running_requests`` from ``/server_info`` (summed over DP ranks)."""
        info = await try_json(session, base_url + "/server_info")
        if not isinstance(info, dict):
            info = await try_json(session, base_url + "/get_server_info")
        if isinstance(info, dict):
            states = info.get("internal_states")
            if isinstance(states, list):
                per_rank = [_positive_int(s.get("max_running_requests")) for s in states if isinstance(s, dict)]
                if per_rank and all(per_rank):
                    return sum(p for p in per_rank if p)
            top = _positive_int(info.get("max_running_requests"))
            if top:
                return top
        return await super().slots(session, base_url, spec)
