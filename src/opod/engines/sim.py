"""``opod sim``: opod's own engine double, run as an engine like any other.

It speaks vLLM's wire here (metric names, ``/tokenize``, ``/sleep``), so this
driver is the vLLM driver with another command line. The simulator can also
impersonate SGLang, llama.cpp and Ollama (``--dialect``); the conformance
suite uses that to test those drivers, each through its own driver.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

import aiohttp

from opod.engines import flags as fl
from opod.engines.base import LaunchSpec
from opod.engines.errors import LaunchError
from opod.engines.vllm import VllmDriver

DEFAULT_MAX_BATCH = 64
"""Requests the simulator runs at once unless told; opod always says it, so the slot count is known."""


_BIND = re.compile(r"^tcp://(\*|[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):(\*|\d{1,5})$")


def _bind_endpoint(flags: Mapping[str, object]) -> str | None:
    """``kv_events_bind``: a second endpoint the sim's KV-event PUB socket binds, for an outside subscriber."""
    value = fl.str_flag(flags, "kv_events_bind")
    if value is None:
        return None
    match = _BIND.match(value)
    if not match or (match.group(2) != "*" and not 0 < int(match.group(2)) < 65536):
        raise LaunchError(
            "flags.kv_events_bind",
            f"{value!r} is not a tcp://HOST:PORT endpoint to bind",
            "use e.g. tcp://127.0.0.1:5560 (or tcp://*:5560 for every interface), a port of its own per engine",
        )
    return value


class SimDriver(VllmDriver):
    id = "sim"
    aliases = ()
    native = "id"
    dialect = "vllm"
    publishes_kv_events = True  # ``--kv-events``: the same frames as vLLM's
    flag_keys = frozenset(
        {
            "dialect",
            "seed",
            "max_num_seqs",
            "np",
            "max_model_len",
            "ctx",
            "time_scale",
            "block_size",
            "kv_blocks",
            "load_ms",
            "mode",
            "kv_events_bind",
            "max_lora_rank",
            "max_loras",
            "extra",
        }
    )
    reserved = frozenset(
        {"--host", "--port", "--model", "--dialect", "--kv-events", "--enable-lora", "--max-lora-rank"}
    )

    def max_batch(self, spec: LaunchSpec) -> int:
        f = spec.flags
        return (
            fl.int_flag(f, "max_num_seqs", minimum=1)
            or fl.int_flag(f, "np", minimum=1)
            or spec.parallel
            or DEFAULT_MAX_BATCH
        )

    def argv(self, spec: LaunchSpec) -> list[str]:
        """``python -m opod sim --host H --port P --model ID --dialect vllm --max-batch N`` + plan flags."""
        fl.check_spec(spec)
        f = spec.flags
        dialect = fl.str_flag(f, "dialect")
        if dialect not in (None, self.dialect):
            # This driver reads vLLM's names; another dialect's metrics and endpoints would be misread.
            raise LaunchError(
                "flags.dialect",
                f"{dialect!r}: the sim engine speaks vLLM's wire",
                f"to simulate {dialect}, start 'opod sim --dialect {dialect}' and use the {dialect} driver",
            )
        prefix = list(spec.launcher) or [spec.binary or sys.executable, "-m", "opod", "sim"]
        out = prefix + [
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--model",
            spec.model_id,
            "--dialect",
            self.dialect,
            "--max-batch",
            str(self.max_batch(spec)),
        ]
        max_len = fl.int_flag(f, "max_model_len", minimum=2) or fl.int_flag(f, "ctx", minimum=2) or spec.context
        if max_len:
            out += ["--max-model-len", str(max_len)]
        for key, flag in (("seed", "--seed"), ("block_size", "--block-size"), ("kv_blocks", "--kv-blocks")):
            value = fl.int_flag(f, key, minimum=0 if key == "seed" else 1)
            if value is not None:
                out += [flag, str(value)]
        for key, flag in (("time_scale", "--time-scale"), ("load_ms", "--load-ms")):
            amount = fl.float_flag(f, key, low=0.0, high=1e9, low_inclusive=True)
            if amount is not None:
                out += [flag, f"{amount:g}"]
        mode = fl.str_flag(f, "mode", choices=("random", "echo"))
        if mode:
            out += ["--mode", mode]
        if spec.kv_events_endpoint:
            out += ["--kv-events", spec.kv_events_endpoint]
        bind = _bind_endpoint(f)
        if bind:
            out += ["--kv-events-bind", bind]
        return out + self.lora_args(spec) + fl.extra_args(f, self.reserved)

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        return {}

    async def slots(self, session: aiohttp.ClientSession, base_url: str, spec: LaunchSpec | None = None) -> int | None:
        return self.max_batch(spec) if spec is not None else None
