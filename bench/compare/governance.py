"""Every governance area of opod turned on, as an operator turns them on: ``opod ctl`` against the fleet's leader.

An organization, team and project with a key of that project (the key the benchmark sends with), and
in the cluster settings a price for the model, a budget on the project large enough never to refuse,
retention of request and answer bodies, and a guardrail, which is one of two:

- ``policy`` (the ``opod`` path): the settings' guard policy ``screen``, which every request gets by
  ``default`` and the gateway runs itself (personal data and a pattern; no call leaves the leader);
- ``webhook`` (the ``opod-webhook`` path): no guard policy, but one ``pre`` guardrail in the mounted
  policy file, whose webhook (``bench/webhook.py``, a process of its own) allows everything.

The mounted policy file holds the cache-aware routing policy either way. One request is sent with the
key and its record read back for each guardrail in use, so a run whose governance did not take says
so before measuring. Both guardrails apply to every request of the leader they are on, so where both
paths run on one fleet, :meth:`Governed.use` puts the path's own in force before each of its turns.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.guard import GUARD, GUARD_POLICY
from bench.ports import free_port
from bench.procs import OPOD, wait_http
from bench.routing import fleet as fleet_mod
from bench.routing import peers
from bench.routing.fleet import Fleet

ORG, TEAM, PROJECT = "acme", "ml", "chat"
SCOPE = f"project:{ORG}/{TEAM}/{PROJECT}"
BUDGET_MICROS = 10**12
"""A million currency units a month: far above what any run spends."""
WEBHOOK_RULE = "screen-webhook"
"""The policy file's ``pre`` guardrail of the ``opod-webhook`` path, as the request's record names it."""
GUARDRAILS = {"opod": "policy", "opod-webhook": "webhook"}
"""Each governed path → its guardrail."""
RECORDED = {"policy": GUARD_POLICY, "webhook": WEBHOOK_RULE}
"""Each guardrail → the ``guard_policy`` a request it allowed is recorded with."""


def settings_body(model: str, guardrail: str = "policy") -> str:
    """The cluster settings (``docs/settings.md``): the model's price, the project's budget, bodies kept, and the
    guard policy where ``guardrail`` is ``policy``."""
    body = (
        "prices:\n"
        f"  {model}: {{input_per_million: 0.5, output_per_million: 1.5}}\n"
        "budgets:\n"
        f"  - {{scope: '{SCOPE}', period: month, micros: {BUDGET_MICROS}}}\n"
        "retention:\n"
        "  bodies: true\n"
    )
    return body + GUARD if guardrail == "policy" else body


def policy_file(guardrail: str, webhook: peers.RunningPeer | None) -> dict[str, Any]:
    """The mounted policy: the prefix routing policy, and for ``webhook`` the one ``pre`` guardrail on it."""
    if guardrail != "webhook":
        return dict(fleet_mod.PREFIX_POLICY)
    assert webhook is not None
    return {
        **fleet_mod.PREFIX_POLICY,
        "guardrails": [{"id": WEBHOOK_RULE, "phase": "pre", "url": webhook.url + "/pre"}],
    }


@dataclass
class Governed:
    fleet: Fleet
    key: str
    """The project's API key: what the governed paths send with."""
    webhook: peers.RunningPeer | None
    """The guardrail webhook, where the ``opod-webhook`` path runs."""
    version: int = 0
    """The settings version in force (the base of the next change)."""
    guardrail: str = ""
    """The guardrail in force: ``policy`` or ``webhook``."""
    switches: int = 0
    """Times :meth:`use` changed the guardrail after the checks."""
    checks: dict[str, str] = field(default_factory=dict)
    """Each guardrail → what the leader recorded for its checking request (cost, guardrail, kept body)."""

    def use(self, guardrail: str) -> None:
        """Put ``guardrail`` in force and the other out: the settings (a new version, in force on the leader at once)
        and the mounted policy (waited for until the leader applied it)."""
        if guardrail == self.guardrail:
            return
        self.version = put_settings(self.fleet, settings_body(fleet_mod.MODEL, guardrail), self.version)
        self.fleet.set_policy(policy_file(guardrail, self.webhook), f"governed-{guardrail}-{secrets.token_hex(3)}")
        if self.guardrail:
            self.switches += 1
        self.guardrail = guardrail

    def stop(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()


def ctl(fleet: Fleet, *args: str) -> str:
    """``opod ctl ARGS`` as an operator on the leader's machine runs it; its standard output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
    env.update(OPOD_HOME=str(fleet.leader_home), OPOD_ADMIN_URL=fleet.admin_url, NO_COLOR="1", COLUMNS="200")
    done = subprocess.run([*OPOD, "ctl", *args], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"opod ctl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout


def start_webhook(scratch: Path) -> peers.RunningPeer:
    port = free_port()
    log = scratch / "guardrail-webhook.log"
    proc = peers.spawn([sys.executable, str(Path(__file__).parents[1] / "webhook.py"), str(port)], log)
    hook = peers.RunningPeer("guardrail", "guardrail webhook (allows all)", f"http://127.0.0.1:{port}", {}, proc, log)
    try:
        wait_http(hook.url + "/health", 30)
    except RuntimeError:
        hook.stop()
        raise
    return hook


def enable(fleet: Fleet, scratch: Path, paths: list[str]) -> Governed:
    """Turn every area on for ``fleet`` with each of ``paths``' guardrails in turn, checking one request through
    each; the last one stays in force. The webhook, where one path needs it, runs until ``stop``."""
    guardrails = list(dict.fromkeys(GUARDRAILS[p] for p in paths))
    ctl(fleet, "orgs", "add", ORG)
    ctl(fleet, "teams", "add", TEAM, "--in", ORG)
    ctl(fleet, "projects", "add", PROJECT, "--in", f"{ORG}/{TEAM}")
    key = json.loads(ctl(fleet, "keys", "create", "compare-bench", "--project", f"{ORG}/{TEAM}/{PROJECT}", "--json"))[
        "secret"
    ]
    body = scratch / "settings.yaml"
    body.write_text(settings_body(fleet_mod.MODEL, guardrails[0]))
    ctl(fleet, "settings", "edit", "--file", str(body), "--base", "0", "--note", "compare benchmark: governance on")
    governed = Governed(fleet, key, start_webhook(scratch) if "webhook" in guardrails else None)
    try:
        governed.version = settings_version(fleet)
        governed.guardrail = guardrails[0]
        fleet.set_policy(policy_file(guardrails[0], governed.webhook), f"governed-{secrets.token_hex(3)}")
        for guardrail in guardrails:
            governed.use(guardrail)
            governed.checks[guardrail] = _check(fleet, key, RECORDED[guardrail])
        governed.switches = 0
    except BaseException:
        governed.stop()
        raise
    return governed


def _admin(
    fleet: Fleet, path: str, method: str = "GET", body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        fleet.admin_url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {fleet.key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        said = err.read()[:500]
        return err.code, {"error": said.decode(errors="replace")}


def settings_version(fleet: Fleet) -> int:
    status, view = _admin(fleet, "/api/v1/settings")
    if status != 200:
        raise RuntimeError(f"GET /api/v1/settings answered {status}: {view}")
    return int(view["version"])


def put_settings(fleet: Fleet, body: str, base: int) -> int:
    """A new settings version on ``base`` (``/api/v1/settings``, as ``opod ctl settings edit`` sends it); its number."""
    note = "compare benchmark: the path's guardrail"
    status, view = _admin(fleet, "/api/v1/settings", "PUT", {"base": base, "body": body, "note": note})
    if status != 200:
        raise RuntimeError(f"the leader refused the settings change: {status} {view}")
    return int(view["version"])


def _check(fleet: Fleet, key: str, guard_policy: str, timeout: float = 30.0) -> str:
    """One chat with the project's key; its record must show a cost, ``guard_policy``'s allow and a kept body."""
    request_id = "compare-check-" + secrets.token_hex(4)
    body = json.dumps(
        {"model": fleet_mod.MODEL, "messages": [{"role": "user", "content": "governance check"}], "max_tokens": 4}
    ).encode()
    call = urllib.request.Request(
        fleet.url + "/v1/chat/completions",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", "X-Request-Id": request_id},
    )
    deadline = time.monotonic() + timeout
    while True:  # the policy and settings are in force within a watcher poll
        try:
            with urllib.request.urlopen(call, timeout=30) as response:
                response.read()
            break
        except urllib.error.HTTPError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the governed opod refused the check request: {err.code} {err.read()[:300]!r}"
                ) from None
            time.sleep(0.5)
    record: dict[str, Any] = {}
    kept = 0
    while time.monotonic() < deadline:
        status, record = _admin(fleet, f"/api/v1/requests/{request_id}")
        kept, _ = _admin(fleet, f"/api/v1/requests/{request_id}/body")
        if status == 200 and record.get("cost_micros") and record.get("guard_action") and kept == 200:
            break
        time.sleep(0.3)
    else:
        raise RuntimeError(
            f"governance did not take on the check request {request_id}: record {record or 'absent'}, body answered {kept}"
        )
    if (record["guard_action"], record.get("guard_policy")) != ("allow", guard_policy):
        raise RuntimeError(
            f"the check request {request_id} was not allowed by {guard_policy!r}: its record shows guard_action "
            f"{record['guard_action']!r}, guard_policy {record.get('guard_policy')!r}"
        )
    kind = "guard policy" if guard_policy == GUARD_POLICY else "guardrail webhook"
    return (
        f"check request {request_id}: project {record.get('project_id')}, cost {record['cost_micros']} micros, "
        f"{kind} {record['guard_policy']} {record['guard_action']} in {record.get('guard_ms', 0)} ms, body kept"
    )
