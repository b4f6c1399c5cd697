"""The peers opod is compared with, each installed into its own virtual environment and run on loopback.

Every peer lives in ``<peers dir>/<name>`` (default ``~/.cache/opod-bench/peers``),
created on first use with ``python -m venv`` and ``pip install`` of a pinned
version, so the project's own environment never sees them. A peer that cannot
be installed or started raises :class:`PeerUnavailable` with the reason, and
the report shows that reason in its row instead of leaving the row out.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.ports import free_port

MARKER = ".opod-bench-requirement"
DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opod-bench" / "peers"


class PeerUnavailable(RuntimeError):
    """This peer cannot run here; the message is the reason the report prints."""


@dataclass(frozen=True)
class PeerSpec:
    name: str
    requirement: str
    first_install: str
    """What the first install costs, measured on the project's 2-core machine."""


SPECS = {
    # Versions the project's notes show installing and serving on this machine kind.
    "litellm": PeerSpec("litellm", "litellm[proxy]==1.108.7", "about 45-75 s, 760 MB"),
    "vllm-router": PeerSpec("vllm-router", "vllm-router==0.1.17", "about 15 s, 130 MB"),
    "sglang-router": PeerSpec("sglang-router", "sglang-router==0.3.2", "about 15 s, 150 MB"),
}


def ensure_installed(spec: PeerSpec, root: Path, timeout: float = 1800) -> Path:
    """The peer's venv, created and installed on first use; raises PeerUnavailable when pip cannot."""
    venv = root / spec.name
    marker = venv / MARKER
    if marker.is_file() and marker.read_text().strip() == spec.requirement:
        return venv
    root.mkdir(parents=True, exist_ok=True)
    # Two runs at once (the test suite's smoke runs, in parallel) install one peer once: the second waits, then reuses it.
    with (root / f"{spec.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text().strip() == spec.requirement:
            return venv
        _install(spec, venv, root, timeout)
    return venv


def _install(spec: PeerSpec, venv: Path, root: Path, timeout: float) -> None:
    marker = venv / MARKER
    log = root / f"{spec.name}.install.log"
    with log.open("w") as out:
        steps = (
            [sys.executable, "-m", "venv", str(venv)],
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                spec.requirement,
            ],
        )
        for argv in steps:
            try:
                code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                raise PeerUnavailable(f"`{' '.join(argv[-2:])}` took longer than {timeout:.0f}s (log: {log})") from None
            if code != 0:
                raise PeerUnavailable(f"`{' '.join(argv[-2:])}` failed with exit {code}: {_tail(log)} (log: {log})")
    marker.write_text(spec.requirement + "\n")


def _tail(path: Path, lines: int = 2) -> str:
    try:
        text = [
            line
            for line in path.read_text(errors="replace").splitlines()
            if line.strip() and not line.startswith("WARNING: Location")
        ]
    except OSError:
        return ""
    return " | ".join(text[-lines:])[:300]


@dataclass
class RunningPeer:
    name: str
    label: str
    """What the report calls this row, mode included."""
    url: str
    headers: dict[str, str]
    proc: subprocess.Popen
    log: Path
    notes: list[str] = field(default_factory=list)
    metrics_url: str = ""
    """The peer's Prometheus page, where it has one."""
    policy: str = ""
    """The routing policy it really runs (after any fallback)."""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            except ProcessLookupError:
                pass


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}, "NO_COLOR": "1", **(env or {})}
    with log.open("w") as out:
        # Its own session, so stopping it takes every child with it.
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full, start_new_session=True)


def _wait_ready(peer: RunningPeer, model: str, timeout: float) -> None:
    """Until one chat request through the peer answers 200; the peer is stopped and reported otherwise."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 2}).encode()
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if peer.proc.poll() is not None:
            peer.stop()
            raise PeerUnavailable(f"exited with {peer.proc.returncode} while starting: {_tail(peer.log, 3)}")
        request = urllib.request.Request(
            peer.url + "/v1/chat/completions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", **peer.headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}: {err.read()[:200]!r}"
        except OSError as err:
            last = str(err)
        time.sleep(0.3)
    peer.stop()
    raise PeerUnavailable(f"no successful chat request within {timeout:.0f}s (last: {last}; log: {_tail(peer.log, 2)})")


# -- the peers ----------------------------------------------------------------------------------


def start_litellm(venv: Path, engines: list[str], model: str, scratch: Path) -> RunningPeer:
    """LiteLLM's proxy with one deployment per engine under one model name (its default simple-shuffle routing)."""
    key = "sk-" + secrets.token_hex(16)
    deployments = [
        {
            "model_name": model,
            "litellm_params": {"model": f"openai/{model}", "api_base": base + "/v1", "api_key": "none"},
        }
        for base in engines
    ]
    config = {
        "model_list": deployments,
        "litellm_settings": {"drop_params": True, "telemetry": False},
        "router_settings": {"routing_strategy": "simple-shuffle"},
        "general_settings": {},
    }
    path = scratch / "litellm.json"
    path.write_text(json.dumps(config))  # YAML is a superset of JSON, so the proxy reads it as its config
    port = free_port()
    log = scratch / "litellm.log"
    proc = spawn(
        [str(venv / "bin" / "litellm"), "--config", str(path), "--host", "127.0.0.1", "--port", str(port)],
        log,
        env={
            "LITELLM_MASTER_KEY": key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_LOG": "ERROR",
        },
    )
    peer = RunningPeer(
        "litellm",
        "LiteLLM proxy (simple-shuffle)",
        f"http://127.0.0.1:{port}",
        {"Authorization": f"Bearer {key}"},
        proc,
        log,
    )
    _wait_ready(peer, model, 180)
    return peer


_DIALABLE = re.compile(r"^tcp://[^*:/\s]+:[1-9]\d{0,4}$")
"""What vllm-router's SUB socket can connect to: a concrete host and a nonzero port (its own rule)."""


def kv_aware_gap(engines: list[str], sources: Mapping[str, str]) -> str:
    """Why vllm-router's kv_aware cannot score these engines; empty when it can.

    kv_aware needs, for every engine, a KV-event PUB endpoint it can dial
    (``sources``: engine URL → ``tcp://HOST:PORT``) and the render endpoint it
    tokenizes through (``POST /v1/chat/completions/render``).
    """
    missing = []
    lacking = [base for base in engines if not _DIALABLE.match(sources.get(base, ""))]
    if lacking:
        missing.append(
            f"publish no KV events vllm-router can subscribe to ({len(lacking)} of {len(engines)} bind no "
            "tcp://HOST:PORT endpoint; their workers start them without the kv_events_bind flag)"
        )
    request = urllib.request.Request(
        engines[0] + "/v1/chat/completions/render",
        data=b'{"messages":[{"role":"user","content":"x"}]}',
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5):
            pass
    except urllib.error.HTTPError as err:
        if err.code in (403, 404, 405):  # vLLM answers 403 without --enable-scale-out
            missing.append("serve no POST /v1/chat/completions/render")
    except OSError:
        missing.append("serve no POST /v1/chat/completions/render")
    return "the simulator engines " + " and ".join(missing) if missing else ""


def start_vllm_router(
    venv: Path,
    engines: list[str],
    model: str,
    block_size: int,
    scratch: Path,
    *,
    policy: str = "kv_aware",
    kv_sources: Mapping[str, str] | None = None,
) -> RunningPeer:
    """vllm-router in ``policy``; kv_aware subscribes to every engine's KV events, and falls back to cache_aware (labelled so) where it cannot."""
    port, metrics_port = free_port(), free_port()
    argv = [
        str(venv / "bin" / "vllm-router"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *engines,
        "--prometheus-port",
        str(metrics_port),
        "--log-level",
        "warning",
    ]
    gap = kv_aware_gap(engines, kv_sources or {}) if policy == "kv_aware" else ""
    if policy != "kv_aware" or gap:
        argv += ["--policy", "cache_aware"]
        label = "vllm-router (cache_aware; kv_aware impossible here)" if gap else "vllm-router (cache_aware)"
    else:
        argv += ["--policy", "kv_aware", "--kv-event-block-size", str(block_size), "--kv-event-model", model]
        for base in engines:
            argv += ["--kv-event-source", f"{base}={kv_sources[base]}"]  # type: ignore[index]
        label = "vllm-router (kv_aware)"
    log = scratch / f"vllm-router-{policy}.log"
    peer = RunningPeer(
        "vllm-router",
        label,
        f"http://127.0.0.1:{port}",
        {},
        spawn(argv, log),
        log,
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        policy=argv[argv.index("--policy") + 1],
    )
    if gap:
        peer.notes.append(f"kv_aware not run: {gap}; ran cache_aware, its best mode that works here")
    _wait_ready(peer, model, 60)
    return peer


# -- what vllm-router's kv_aware says it did -------------------------------------------------------

KV_COUNTERS = ("vllm_router_kv_placement_lookups_total", "vllm_router_kv_routing_inputs_total")


def router_counters(peer: RunningPeer) -> dict[str, float]:
    """The peer's KV counters as ``name{labels}`` → value; empty when it exposes none (or no metrics port)."""
    if not peer.metrics_url:
        return {}
    try:
        with urllib.request.urlopen(peer.metrics_url, timeout=5) as response:
            return parse_kv_counters(response.read().decode())
    except OSError:
        return {}


def parse_kv_counters(text: str) -> dict[str, float]:
    """The ``vllm_router_kv_*`` samples of a Prometheus page."""
    out = {}
    for line in text.splitlines():
        if line.startswith(KV_COUNTERS):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def _by_result(counters: Mapping[str, float], name: str) -> dict[str, float]:
    found = {}
    for key, value in counters.items():
        if key.startswith(name + "{"):
            match = re.search(r'result="([^"]*)"', key)
            if match:
                found[match.group(1)] = found.get(match.group(1), 0.0) + value
    return found


def kv_credit_note(before: Mapping[str, float], after: Mapping[str, float], phase: str) -> str:
    """Did kv_aware credit any worker with a cached prefix during ``phase``? From its placement-lookup counters."""
    delta = {key: moved for key in after if (moved := after[key] - before.get(key, 0.0)) > 0}
    lookups = _by_result(delta, KV_COUNTERS[0])
    inputs = _by_result(delta, KV_COUNTERS[1])
    if not lookups and not inputs:
        return f"kv_aware during {phase}: its metrics show no KV lookups (no vllm_router_kv_* counters moved)"
    hits = lookups.get("hit", 0.0)
    total = sum(lookups.values())
    detail = ", ".join(f"{result} {count:,.0f}" for result, count in sorted(lookups.items()))
    rendered = ", ".join(f"{result} {count:,.0f}" for result, count in sorted(inputs.items()))
    verdict = "prefix credit appeared" if hits else "no prefix credit"
    return (
        f"kv_aware during {phase}: {verdict}: {hits:,.0f} of {total:,.0f} placement lookups hit a worker's cached blocks "
        f"(vllm_router_kv_placement_lookups_total: {detail or 'none'}; token inputs: {rendered or 'none'})"
    )


def start_sglang_router(venv: Path, engines: list[str], model: str, scratch: Path) -> RunningPeer:
    """sglang-router's cache-aware policy (an approximate radix tree over request text), as shipped."""
    port = free_port()
    argv = [
        str(venv / "bin" / "python"),
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *engines,
        "--policy",
        "cache_aware",
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "warn",
    ]
    log = scratch / "sglang-router.log"
    peer = RunningPeer(
        "sglang-router", "sglang-router (cache_aware)", f"http://127.0.0.1:{port}", {}, spawn(argv, log), log
    )
    _wait_ready(peer, model, 60)
    return peer


def start_governed_floor(engines: list[str], model: str, scratch: Path) -> RunningPeer:
    """The governed Python relay (``bench.routing.governed_floor``): the bare relay plus governance's least work."""
    key = "sk-bench-" + secrets.token_hex(16)
    label = "governed Python relay (the bare relay plus each governance area's least work; a yardstick)"
    home = str(scratch / "governed-floor")
    return _start_yardstick(
        "governed-floor", label, "governed_floor", [key, model, home, *engines], key, model, scratch
    )


def start_floor(engines: list[str], model: str, scratch: Path) -> RunningPeer:
    """The bare Python relay (``bench.routing.floor``): a yardstick run from this interpreter, nothing to install."""
    label = "bare Python relay (uvloop + httptools, round robin; a yardstick)"
    return _start_yardstick("relay-floor", label, "floor", engines, "", model, scratch)


def _start_yardstick(
    name: str, label: str, module: str, args: list[str], key: str, model: str, scratch: Path
) -> RunningPeer:
    """One of the bench's own relays (``bench.routing.MODULE PORT ARGS...``), run from this interpreter with this
    checkout on its path; ``key`` is the API key it asks for ('' for none)."""
    port = free_port()
    log = scratch / f"{name}.log"
    path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")) if p)
    peer = RunningPeer(
        name,
        label,
        f"http://127.0.0.1:{port}",
        {"Authorization": f"Bearer {key}"} if key else {},
        spawn([sys.executable, "-m", f"bench.routing.{module}", str(port), *args], log, {"PYTHONPATH": path}),
        log,
    )
    _wait_ready(peer, model, 30)
    return peer
