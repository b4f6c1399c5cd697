"""The simulator fleet every path shares: one opod leader, N ``opod join`` workers, one sim engine each.

The engines are started by opod's workers (so the "through opod" path is the
real one), and their loopback addresses are read from the workers' logs so that
the direct path and the peers reach the very same processes: every path sees
the same caches and the same latency model.

Each engine's KV-event PUB socket also binds a loopback port of its own (the
plan flag ``kv_events_bind``, one ``OPOD_ENGINE_FLAGS`` per worker), so
vllm-router's ``kv_aware`` subscribes to the very events opod's worker hears.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.ports import free_port
from bench.procs import Proc, wait_http, wait_model_ready

MODEL = "sim-chat"

PREFIX_POLICY = {"routing": {"prefixBlockWeight": 1.0, "kvWeight": 1.0, "prefixAffinity": True}}
"""opod's cache-aware routing turned on (the lead's policy keys); an empty policy is plain round robin."""


@dataclass(frozen=True)
class SimProfile:
    """The simulator options every engine runs with (passed to the workers as ``OPOD_ENGINE_FLAGS``)."""

    block_size: int = 16
    kv_blocks: int = 384
    max_num_seqs: int = 64
    ttft_ms: float = 20.0
    prefill_ms_per_token: float = 0.5
    itl_ms: float = 25.0
    itl_ms_per_request: float = 0.2
    answer_tokens: int = 512
    """Every natural answer's length, so ``max_tokens`` alone sets it (no ``ignore_eos``, which a proxy may drop)."""
    max_model_len: int = 16384
    seed: int = 0
    time_scale: float = 1.0
    """Multiplies the whole latency model; 0: engines that answer at once."""

    def engine_flags(self) -> dict:
        # The latency model's knobs have no plan-flag names of their own: they go through ``extra``.
        extra = [
            "--ttft-ms",
            f"{self.ttft_ms:g}",
            "--prefill-ms-per-token",
            f"{self.prefill_ms_per_token:g}",
            "--itl-ms",
            f"{self.itl_ms:g}",
            "--itl-ms-per-request",
            f"{self.itl_ms_per_request:g}",
            "--output-min",
            str(self.answer_tokens),
            "--output-max",
            str(self.answer_tokens),
        ]
        return {
            "block_size": self.block_size,
            "kv_blocks": self.kv_blocks,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "seed": self.seed,
            "time_scale": self.time_scale,
            "extra": extra,
        }


def worker_flags(profile: SimProfile, kv_port: int) -> dict:
    """One worker's ``OPOD_ENGINE_FLAGS``: the shared profile, plus the KV-event port its engine binds for outside subscribers.

    Each worker starts one engine, so each needs a port of its own.
    """
    return {**profile.engine_flags(), "kv_events_bind": f"tcp://127.0.0.1:{kv_port}"}


@dataclass
class Fleet:
    leader: Proc
    url: str
    admin_url: str
    key: str
    policy_path: Path
    workers: dict[str, Proc] = field(default_factory=dict)
    engines: list[str] = field(default_factory=list)
    """The sim engines' base URLs, in worker order."""
    kv_sources: dict[str, str] = field(default_factory=dict)
    """Engine base URL → the ``tcp://127.0.0.1:PORT`` its KV-event PUB socket binds for outside subscribers."""
    leader_home: Path = field(default_factory=Path)
    """The leader's ``OPOD_HOME`` (its admin key, its store), where ``opod ctl`` finds what it needs."""

    # -- opod's routing policy -----------------------------------------------------------------

    def set_policy(self, policy: dict, revision: str, timeout: float = 10.0) -> None:
        """Swap the policy file (atomically, as a manager would) and wait until the leader says it applied it."""
        body = {"revision": revision, **policy}
        scratch = self.policy_path.with_suffix(".tmp")
        scratch.write_text(json.dumps(body))
        os.replace(scratch, self.policy_path)
        try:
            self.leader.wait_for(rf"policy file .* applied: revision '{revision}'", timeout)
        except RuntimeError:
            # The log line is a convenience; two watcher polls are enough when it is not printed.
            time.sleep(1.5)

    # -- engine state --------------------------------------------------------------------------

    def reset_caches(self, timeout: float = 30.0) -> None:
        """Empty every engine's prefix cache, so no path inherits another's warm cache."""
        for base in self.engines:
            deadline = time.monotonic() + timeout
            while True:
                ok = _post_json(base + "/reset_prefix_cache", {}).get("success")
                if ok:
                    break
                # The engine refuses while a request still holds blocks (a straggler from the last phase).
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{base} would not reset its prefix cache within {timeout}s (requests still running)"
                    )
                time.sleep(0.2)

    def served(self) -> list[int]:
        """Requests each engine has taken so far (its ``/sim/state``), in engine order."""
        counts = []
        for base in self.engines:
            with urllib.request.urlopen(base + "/sim/state", timeout=10) as response:
                counts.append(int(json.loads(response.read())["requests"]))
        return counts

    def cache_counters(self) -> tuple[float, float]:
        """(prompt tokens queried, prompt tokens found cached), summed over the engines."""
        queries = hits = 0.0
        for base in self.engines:
            with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
                text = response.read().decode()
            queries += _counter(text, "vllm:prefix_cache_queries")
            hits += _counter(text, "vllm:prefix_cache_hits")
        return queries, hits

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        self.leader.stop()


def _counter(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith(name + "_created"):
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] in (name, name + "_total"):
                total += float(value)
    return total


def _post_json(url: str, body: dict, key: str = "", timeout: float = 30.0) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null") or {}
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"POST {url} answered {err.code}: {err.read()[:300]!r}") from err


def start(home: Path, workers: int, profile: SimProfile, on_step=lambda text: None) -> Fleet:
    """``opod up --no-worker`` plus ``workers`` × ``opod join --engine sim``, the model loaded on each."""
    home.mkdir(parents=True, exist_ok=True)
    policy_path = home / "policy.json"
    policy_path.write_text(json.dumps({"revision": "round-robin"}))
    port, admin_port = free_port(), free_port()
    on_step("starting the opod leader")
    leader = Proc(
        [
            "up",
            "--no-worker",
            "--no-default-models",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            f"127.0.0.1:{admin_port}",
        ],
        home / "leader",
        env={"OPOD_POLICY_FILE": str(policy_path)},
    )
    fleet = Fleet(leader, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", "", policy_path)
    fleet.leader_home = home / "leader"
    try:
        leader.wait_for("OpenAI API on", 90)
        fleet.key = (home / "leader" / "admin.key").read_text().strip()
        token = _post_json(fleet.admin_url + "/api/v1/node-tokens", {"name": "bench"}, fleet.key)["secret"]
        on_step(f"starting {workers} opod workers (sim engine)")
        for i in range(workers):
            node = f"n_bench-{i}"
            flags = json.dumps(worker_flags(profile, free_port()))
            fleet.workers[node] = Proc(
                ["join", fleet.url, "--token", token, "--engine", "sim", "--listen", f"127.0.0.1:{free_port()}"],
                home / node,
                env={"OPOD_NODE_ID": node, "OPOD_ENGINE_FLAGS": flags},
            )
        for worker in fleet.workers.values():
            worker.wait_for("registered with", 120)
        _post_json(
            fleet.admin_url + "/api/v1/models",
            {"name": MODEL, "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "max": 0}},
            fleet.key,
        )
        on_step(f"loading {MODEL} on every worker")
        for node in fleet.workers:
            _post_json(fleet.admin_url + f"/api/v1/models/{MODEL}/load", {"node": node}, fleet.key)
        for worker in fleet.workers.values():
            fleet.engines.append(worker.wait_for(rf"{MODEL} serving on (http://127\.0\.0\.1:\d+)", 180).group(1))
        for base in fleet.engines:
            wait_http(base + "/health", 60)
        fleet.kv_sources = kv_sources(fleet.engines)
        _wait_served(fleet, workers)
    except BaseException:
        fleet.stop()
        raise
    return fleet


def kv_sources(engines: list[str]) -> dict[str, str]:
    """Where each engine's KV-event PUB socket bound for outside subscribers, as the engine itself reports it."""
    out = {}
    for base in engines:
        with urllib.request.urlopen(base + "/sim/state", timeout=10) as response:
            bound = json.loads(response.read()).get("kv_events_bind")
        if bound:
            out[base] = bound
    return out


def _wait_served(fleet: Fleet, workers: int, timeout: float = 90.0) -> None:
    """Until the leader routes the model to every worker."""
    wait_model_ready(fleet.admin_url, fleet.key, MODEL, workers, timeout)
