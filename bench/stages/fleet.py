"""The leaders the stages bench measures: one per governance configuration, each with ``opod join`` workers.

Every leader runs ``opod up --no-worker`` under the profiling launcher (:mod:`bench.stages.launch`), and
one worker joins it with a zero-latency simulator (two for prefix routing, which hashes a request only
where there is a choice to make), so the engine is not the cost. Each configuration
turns on governance areas the way a user does: the tenancy tree and a project's key through
``/api/v1``; prices, budgets, kept bodies and the guard policy (checks the gateway runs in process) in the
settings; guardrail webhooks and the prefix routing policy in a mounted policy file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bench.guard import GUARD, GUARD_POLICY
from bench.ports import free_port
from bench.procs import Proc, wait_model_ready
from bench.routing.fleet import PREFIX_POLICY
from bench.routing.workloads import distinct_chat_bodies
from bench.tenancy_overhead import BODY, MODEL, _admin, _headers
from opod.gateway.relay import WORKER_HEADER

LAUNCH = ["-m", "bench.stages.launch"]
"""The leader's program after its Python: ``opod`` in a process whose profiling window a signal opens."""
REPO = Path(__file__).resolve().parents[2]
SIMULATOR = {"time_scale": 0, "max_num_seqs": 1024}
BIG = 10**15
"""A budget no run comes near: the reservation and settlement are measured, never a refusal."""


@dataclass(frozen=True)
class Areas:
    """Which governance areas a configuration turns on."""

    tenancy: bool = False
    budget: bool = False
    bodies: bool = False
    guardrail: bool = False
    """Guardrail webhooks in the policy file: one pre, one post (:mod:`bench.webhook`, a process of its own)."""
    guard_policy: bool = False
    """The settings' guard policy (:mod:`bench.guard`), run in the gateway itself: no exchange per request."""
    routing: bool = False
    """The prefix routing policy ``python -m bench compare`` mounts (``bench.routing.fleet.PREFIX_POLICY``), over two
    workers: each request's prefix looked up, the sticky pin, the engines' cache events."""

    def within(self, other: Areas) -> bool:
        """Whether every area turned on here is on in ``other`` too."""
        return all(getattr(other, name) or not on for name, on in vars(self).items())


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    areas: Areas
    base: str
    """The configuration it is compared with: the difference is what its area adds."""


CONFIGS = [
    Config("nothing", "nothing (admin key, no tenancy)", Areas(), ""),
    Config("tenancy", "+ tenancy (a project's key)", Areas(tenancy=True), "nothing"),
    Config("budget", "+ price & budget", Areas(tenancy=True, budget=True), "tenancy"),
    Config("bodies", "+ kept bodies (retention on)", Areas(tenancy=True, bodies=True), "tenancy"),
    Config(
        "guardrail",
        "+ guardrail webhooks (one pre, one post; a process of their own)",
        Areas(tenancy=True, guardrail=True),
        "tenancy",
    ),
    Config(
        "guard-policy",
        "+ guard policy (in process: pii and pattern checks)",
        Areas(tenancy=True, guard_policy=True),
        "tenancy",
    ),
    Config(
        "routing",
        "+ prefix routing (the prefix policy, two workers)",
        Areas(tenancy=True, routing=True),
        "tenancy",
    ),
    Config(
        "all",
        "all on: tenancy, price & budget, kept bodies, guard policy (in process; no webhook), prefix routing",
        Areas(tenancy=True, budget=True, bodies=True, guard_policy=True, routing=True),
        "nothing",
    ),
]
ALL_ON, ALL_OFF = "all", "nothing"
ALL_ON_AREAS = (
    "tenancy, price & budget, kept bodies, the guard policy (in process; no guardrail webhook) and prefix routing"
)
"""What the ``all`` configuration turns on, as the reports say it."""


def settings_body(areas: Areas) -> str:
    """The cluster settings' YAML for ``areas``: prices and a budget on each level, retention of bodies, the guard
    policy."""
    text = ""
    if areas.budget:
        text += (
            "prices:\n  '*': {input_per_million: 0.5, output_per_million: 1.5}\n"
            f"budgets:\n  - {{scope: org:acme, period: month, micros: {BIG}}}\n"
            f"  - {{scope: team:acme/ml, period: week, micros: {BIG}}}\n"
            f"  - {{scope: project:acme/ml/chat, period: day, micros: {BIG}}}\n"
        )
    if areas.bodies:
        text += "retention:\n  bodies: true\n"
    if areas.guard_policy:
        text += GUARD
    return text


def policy_file(path: Path, areas: Areas, webhook: str) -> None:
    """The policy a manager mounts: for guardrail webhooks one before the engine and one after it, both on
    ``webhook``; for prefix routing the prefix policy."""
    policy: dict[str, Any] = {"revision": "bench-stages"}
    if areas.guardrail:
        policy["guardrails"] = [
            {"id": "screen", "phase": "pre", "url": webhook + "/pre"},
            {"id": "answers", "phase": "post", "url": webhook + "/post"},
        ]
    if areas.routing:
        policy.update(PREFIX_POLICY)
    path.write_text(json.dumps(policy))


class Member:
    """One configuration's leader and its workers."""

    def __init__(
        self, config: Config, scratch: Path, webhook: str = "", tree: Path | None = None, python: str = sys.executable
    ) -> None:
        """``webhook``: the guardrail webhook's URL, which a configuration with guardrail webhooks needs. ``tree``:
        another checkout whose ``src/`` the leader runs (``python -m bench stages-ab``); this one's by default.
        ``python``: the interpreter that runs the leader (another virtual environment's); this one by default."""
        if config.areas.guardrail and not webhook:
            raise ValueError(f"{config.name}: a configuration with guardrail webhooks needs the webhook's URL")
        self.config = config
        self.home = scratch / config.name
        (self.home / "leader").mkdir(parents=True)
        self.request_file = self.home / "profile-request.json"
        # The checkout's own src/ first: run from a second worktree, the installed package may be another's. The
        # profiling window (bench.stages.launch) is this checkout's for either, so both count and profile alike.
        root = REPO if tree is None else tree
        path = os.pathsep.join((str(root / "src"), str(REPO)))
        env = {"STAGES_PROFILE_REQUEST": str(self.request_file), "PYTHONPATH": path}
        if config.areas.guardrail or config.areas.routing:
            policy = self.home / "policy.json"
            policy_file(policy, config.areas, webhook)
            env["OPOD_POLICY_FILE"] = str(policy)
        port, self.admin_port = free_port(), free_port()
        args = ["up", "--no-worker", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{self.admin_port}"]
        self.leader = Proc([*args, "--no-default-models"], self.home / "leader", env=env, program=[python, *LAUNCH])
        self.url = f"http://127.0.0.1:{port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.workers: list[Proc] = []
        self.key = ""
        self.admin_key = ""
        self.guard = ""
        """What the leader recorded for a checked request (guard policy configurations): its guard fields."""

    @property
    def pid(self) -> int:
        return self.leader.proc.pid

    @property
    def chat_url(self) -> str:
        return self.url + "/v1/chat/completions"

    def headers(self) -> dict[str, str]:
        return _headers(self.key)

    def listening(self, timeout: float = 90) -> None:
        """Wait until the leader listens, then read its admin key."""
        self.leader.wait_for("OpenAI API on", timeout)
        self.admin_key = self.key = (self.home / "leader" / "admin.key").read_text().strip()

    @property
    def node_ids(self) -> list[str]:
        """Its workers' node ids: two for prefix routing, else one."""
        name = self.config.name
        return [f"n_{name}", f"n_{name}-2"] if self.config.areas.routing else [f"n_{name}"]

    def join(self) -> None:
        """Once the leader listens: a node token, and its workers, each with a simulator, join with it."""
        self.listening()
        token = self.admin("POST", "/api/v1/node-tokens", {"name": "bench"})["secret"]
        for node in self.node_ids:
            env = {"OPOD_ENGINE_FLAGS": json.dumps(SIMULATOR), "OPOD_NODE_ID": node}
            args = ["join", self.url, "--token", token, "--engine", "sim", "--listen", f"127.0.0.1:{free_port()}"]
            self.workers.append(Proc(args, self.home / node.removeprefix("n_"), env=env))

    def configure(self) -> None:
        """The model added (on each worker, for prefix routing), and the configuration's areas turned on as a user
        does."""
        if self.config.areas.routing:
            self.admin(
                "POST",
                "/api/v1/models",
                {"name": MODEL, "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "max": 0}},
            )
            for worker in self.workers:
                worker.wait_for("registered with", 120)
            for node in self.node_ids:
                self.admin("POST", f"/api/v1/models/{MODEL}/load", {"node": node})
            wait_model_ready(self.admin_url, self.admin_key, MODEL, len(self.node_ids), 180)
        else:
            self.admin("POST", "/api/v1/models", {"name": MODEL, "profiles": [{"engine": "sim"}]})
        areas = self.config.areas
        if areas.tenancy:
            for path, body in (
                ("/api/v1/orgs", {"name": "acme"}),
                ("/api/v1/teams", {"name": "ml", "in": "acme"}),
                ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
            ):
                self.admin("POST", path, body)
            made = self.admin("POST", "/api/v1/keys", {"name": "bench", "project": "acme/ml/chat"})
            self.key = made["secret"]
        settings = settings_body(areas)
        if settings:
            try:
                self.admin("PUT", "/api/v1/settings", {"base": 0, "body": settings})
            except RuntimeError as err:  # e.g. an older opod (stages-ab's base) that has no guard section
                raise RuntimeError(
                    f"{self.config.name}: the leader refused the configuration's settings: {err}"
                ) from None

    def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return _admin(self.admin_url, self.admin_key, method, path, body)

    def answers(self, timeout: float = 120) -> None:
        """Wait until a chat request with the configuration's key is answered 200."""
        body = json.dumps(BODY).encode()
        deadline = time.monotonic() + timeout
        said = ""
        while time.monotonic() < deadline:
            request = urllib.request.Request(self.chat_url, data=body, headers=self.headers(), method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    if answer.status == 200:
                        return
            except urllib.error.HTTPError as err:
                said = f"{err.code} {err.read()[:200]!r}"
            except OSError as err:
                said = str(err)
            time.sleep(0.3)
        told = "\n".join(self.leader.lines[-15:] + [line for worker in self.workers for line in worker.lines[-15:]])
        raise RuntimeError(f"{self.config.name}: no answer within {timeout:.0f}s: {said}\n{told}")

    def check_guard(self, timeout: float = 30) -> None:
        """A configuration with the guard policy: one request's record must show the policy's allow, so a run whose
        policy did not take says so before measuring. Sets :attr:`guard`."""
        if not self.config.areas.guard_policy:
            return
        request_id = f"stages-guard-{self.config.name}-{os.getpid()}"
        headers = {**self.headers(), "X-Request-Id": request_id}
        call = urllib.request.Request(self.chat_url, data=json.dumps(BODY).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(call, timeout=10) as answer:
            answer.read()
        deadline = time.monotonic() + timeout
        record: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                record = self.admin("GET", f"/api/v1/requests/{request_id}")
            except RuntimeError:  # not written yet
                record = {}
            if record.get("guard_action"):
                break
            time.sleep(0.3)
        action, policy = record.get("guard_action"), record.get("guard_policy")
        if (action, policy) != ("allow", GUARD_POLICY):
            raise RuntimeError(
                f"{self.config.name}: the guard policy did not take: request {request_id}'s record shows guard_action "
                f"{action!r}, guard_policy {policy!r} (wanted 'allow', {GUARD_POLICY!r}): {record or 'no record'}"
            )
        self.guard = f"guard_action {action}, guard_policy {policy}, guard_ms {record.get('guard_ms', 0)}"

    def check_routing(self, requests: int = 8) -> None:
        """A configuration with prefix routing: sequential chats, each new (the same one would stay on its pinned
        worker), must reach both workers, so a run whose second worker never served says so before measuring."""
        if not self.config.areas.routing:
            return
        seen: set[str] = set()
        for body in distinct_chat_bodies(requests):
            call = urllib.request.Request(self.chat_url, data=body, headers=self.headers(), method="POST")
            with urllib.request.urlopen(call, timeout=10) as answer:
                answer.read()
                seen.add(answer.headers.get(WORKER_HEADER, ""))
        if seen != set(self.node_ids):
            raise RuntimeError(f"{self.config.name}: {requests} chats reached {sorted(seen)}, not {self.node_ids}")

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.leader.stop()


def start_all(configs: list[Config], scratch: Path, webhook: str) -> dict[str, Member]:
    """Every configuration's leader started at once, then its workers, each configured, each answering (and the
    guard policy's and prefix routing's configurations checked)."""
    members: dict[str, Member] = {}
    try:
        for config in configs:
            members[config.name] = Member(config, scratch, webhook)
        ready_all(members)
    except BaseException:
        stop_all(members)
        raise
    return members


def ready_all(members: dict[str, Member]) -> None:
    """Leaders started already: their workers joined, each configured, each answering, the guard policy's and
    prefix routing's configurations checked; each step for all at once, so their waits overlap."""
    for member in members.values():
        member.join()
    for member in members.values():
        member.configure()
    for member in members.values():
        member.answers()
    for member in members.values():
        member.check_guard()
        member.check_routing()


def stop_all(members: dict[str, Member]) -> None:
    """Every process told to stop at once, so their graceful stops overlap; then each waited for."""
    procs = [m.leader for m in members.values()] + [w for m in members.values() for w in m.workers]
    for proc in procs:
        if proc.proc.poll() is None:
            proc.proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.stop()


class Webhook:
    """The guardrail webhook (:mod:`bench.webhook`) in a process of its own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.webhook", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class CpuSample(NamedTuple):
    """A leader's counters from /proc at one moment, or what they moved by between two."""

    cpu: float
    """CPU seconds, user and kernel, every thread."""
    main: float
    """CPU seconds of the main thread (the event loop's)."""
    kernel: float
    """Kernel CPU seconds, every thread: system calls (a loopback write carries the receiver's side of TCP),
    wake-ups, page faults."""
    main_runs: float
    """Times the event loop's thread was put on a CPU (``schedstat``): about one per wake-up from its wait."""

    def since(self, before: CpuSample) -> CpuSample:
        return CpuSample(*(now - then for now, then in zip(self, before, strict=True)))

    def plus(self, more: CpuSample) -> CpuSample:
        return CpuSample(*(one + other for one, other in zip(self, more, strict=True)))


def cpu_sample(pid: int) -> CpuSample:
    """The leader's counters now."""
    process, main = _stat(Path(f"/proc/{pid}/stat")), _stat(Path(f"/proc/{pid}/task/{pid}/stat"))
    runs = int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[2])
    return CpuSample((process[0] + process[1]) / _TICK, (main[0] + main[1]) / _TICK, process[1] / _TICK, runs)


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: Path) -> tuple[int, int]:
    """User and kernel CPU ticks from a ``stat`` file."""
    fields = path.read_text().rpartition(")")[2].split()
    return int(fields[11]), int(fields[12])
