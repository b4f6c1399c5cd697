"""llama.cpp's ``llama-server``: one GGUF per process, on the CPU by default.

Wire facts this driver relies on (llama-server, and the same server inside xllamacpp):

- ``/health`` answers 503 while weights load, then 200;
- ``/metrics`` (only with ``--metrics``) has unlabelled ``llamacpp:*`` series;
  its throughput gauges reset on every scrape, so rates come from counters;
  ``prompt_tokens_total`` excludes cached tokens, ``prompt_tokens_cached_total``
  counts them; there is no KV-usage gauge in current builds;
- ``/props`` carries ``total_slots``; ``/apply-template`` renders the chat
  template and ``/tokenize`` takes ``content``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import aiohttp

from opod.contract import nodeapi
from opod.engines import flags as fl
from opod.engines import llama_binary, promtext
from opod.engines.base import EngineDriver, LaunchSpec, LoadSample, MetricsState
from opod.engines.enginehttp import call_json, try_json
from opod.engines.errors import LaunchError

P = "llamacpp:"
POOLING = ("none", "mean", "cls", "last", "rank")
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_PROMPT_ALL = P + "prompt_tokens_all"
"""Synthetic counter: computed + cached prompt tokens, the whole a hit rate divides by."""


class LlamaCppDriver(EngineDriver):
    id = "llamacpp"
    aliases = ("llama-cpp", "llamacpp-rpc")
    native = "path"
    dialect = "llamacpp"
    can_tokenize = True
    computes_on_cpu = True
    flag_keys = frozenset(
        {"ctx", "np", "ngl", "ctk", "ctv", "tensor_split", "rpc", "pooling", "batch", "ubatch", "extra"}
    )
    reserved = frozenset(
        {"-m", "--model", "--host", "--port", "-a", "--alias", "-hf", "--hf-repo", "-mu", "--model-url"}
    )

    def argv(self, spec: LaunchSpec) -> list[str]:
        """``<route> -m FILE --host H --port P --alias ID --metrics`` plus sizing and plan flags.

        Plan flags pin over the spec: ``ctx`` over ``spec.context``, ``np`` over ``spec.parallel``.
        ``ctx`` is what each request may use, as with every engine; llama-server splits its
        ``--ctx-size`` evenly across its ``--parallel`` slots, so it gets ``ctx × slots``.
        (A unified KV buffer, ``--kv-unified``, would let one request use it all, but a full
        buffer fails every request in flight at once.) A chat model gets ``--jinja``: the
        model's own chat template, which is what renders ``tools`` and parses tool calls.
        """
        fl.check_spec(spec)
        if "," in spec.model_id:
            raise LaunchError(
                "spec.model_id", f"{spec.model_id!r} holds a comma, which --alias reads as a list", "rename it"
            )
        f = spec.flags
        out = list(self.launch_prefix(spec)) + [
            "-m",
            spec.model,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--alias",
            spec.model_id,
            "--metrics",
        ]
        ctx = fl.int_flag(f, "ctx") or spec.context
        slots = fl.int_flag(f, "np", minimum=1) or spec.parallel
        if ctx:
            out += ["-c", str(ctx * slots if slots else ctx)]
        if slots:
            out += ["-np", str(slots)]
        if spec.threads:
            out += ["-t", str(spec.threads)]
        ngl = f.get("ngl")
        if ngl is not None:
            out += ["-ngl", ngl if ngl in ("auto", "all") else str(fl.int_flag(f, "ngl"))]
        for key, flag in (("batch", "-b"), ("ubatch", "-ub")):
            value = fl.int_flag(f, key, minimum=1)
            if value:
                out += [flag, str(value)]
        for key, flag in (("ctk", "-ctk"), ("ctv", "-ctv")):
            cache_type = fl.str_flag(f, key, choices=CACHE_TYPES)
            if cache_type:
                out += [flag, cache_type]
        if spec.rerank:
            out += ["--reranking"]
        elif spec.embeddings:
            out += ["--embeddings"]
            pooling = fl.str_flag(f, "pooling", choices=POOLING)
            if pooling:
                out += ["--pooling", pooling]
        else:
            out += ["--jinja"]
        split = fl.list_flag(f, "tensor_split")
        if split:
            out += ["--tensor-split", ",".join(split)]
        rpc = fl.list_flag(f, "rpc")
        if rpc:
            out += ["--rpc", ",".join(rpc)]
        return out + fl.extra_args(f, self.reserved)

    def launch_prefix(self, spec: LaunchSpec) -> tuple[str, ...]:
        """The worker's choice (``spec.launcher``), else ``spec.binary``, else :func:`llama_binary.resolve`."""
        if spec.launcher:
            return tuple(spec.launcher)
        if spec.binary:
            return (spec.binary,)
        return llama_binary.resolve().argv

    def fallback_after_exit(self, spec: LaunchSpec, returncode: int | None) -> tuple[LaunchSpec, str] | None:
        """After a SIGILL death, the same spec on the portable route and the message to show; ``None`` otherwise."""
        verdict = llama_binary.after_exit(llama_binary.route_of(self.launch_prefix(spec)), returncode)
        if verdict.fallback is None:
            return None
        return replace(spec, launcher=verdict.fallback.argv), verdict.message

    def parse_metrics(
        self, text: str, previous: MetricsState | None, now: float | None = None
    ) -> tuple[LoadSample, MetricsState]:
        now = time.time() if now is None else now
        scrape = promtext.Scrape(text, self.id)
        counters: dict[str, float] = {}
        for name in ("tokens_predicted_total", "prompt_tokens_total", "prompt_tokens_cached_total"):
            value = scrape.total(P + name)
            if value is not None:
                counters[P + name] = value
        if P + "prompt_tokens_total" in counters and P + "prompt_tokens_cached_total" in counters:
            counters[_PROMPT_ALL] = counters[P + "prompt_tokens_total"] + counters[P + "prompt_tokens_cached_total"]
        slots = previous.slots if previous else None
        running = promtext.as_count(scrape.total(P + "requests_processing"))
        kv = promtext.fraction_to_pct(scrape.total(P + "kv_cache_usage_ratio"))
        if kv is None and running is not None and slots:
            # No KV gauge in current builds: busy slots over all slots is the nearest pressure signal.
            kv = min(100.0, 100.0 * running / slots)
        sample = LoadSample(
            sampled_at=now,
            kv_used_pct=kv,
            queue_depth=promtext.as_count(scrape.total(P + "requests_deferred")),
            running=running,
            tokens_per_s=promtext.counter_rate(P + "tokens_predicted_total", counters, previous, now),
            prefix_hit_pct=promtext.counter_share(P + "prompt_tokens_cached_total", _PROMPT_ALL, counters, previous),
            slots=slots,
        )
        return sample, MetricsState(at=now, counters=counters, slots=slots)

    async def slots(self, session: aiohttp.ClientSession, base_url: str, spec: LaunchSpec | None = None) -> int | None:
        """``/props`` ``total_slots``; what the spec asked for when the engine does not say."""
        props = await try_json(session, base_url + "/props")
        total = props.get("total_slots") if isinstance(props, dict) else None
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            return total
        return await super().slots(session, base_url, spec)

    async def tokenize(
        self, session: aiohttp.ClientSession, base_url: str, request: nodeapi.TokenizeRequest
    ) -> list[int] | None:
        """Render the chat template (``/apply-template``), then ``/tokenize`` the text as a chat request would be."""
        if request.messages:
            msgs = [{"role": m.role, "content": m.content} for m in request.messages]
            rendered = await call_json(
                session,
                "POST",
                base_url + "/apply-template",
                engine=self.id,
                what="apply the chat template",
                body={"messages": msgs},
            )
            prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
            if not isinstance(prompt, str):
                return None
        else:
            prompt = request.prompt
        body = {"content": prompt, "add_special": True, "parse_special": True}
        answer = await call_json(session, "POST", base_url + "/tokenize", engine=self.id, what="tokenize", body=body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            return None
        named = [t if isinstance(t, int) else t.get("id") for t in tokens if isinstance(t, int | dict)]
        ids = [i for i in named if isinstance(i, int)]
        return ids[: request.max_tokens] if request.max_tokens > 0 else ids
