"""Every governance area of opod turned on, as an operator turns them on: ``opod ctl`` against the fleet's leader.

An organization, team and project with a key of that project (the key the benchmark sends with), a
price for the model, a budget on the project large enough never to refuse, retention of request and
answer bodies, and one ``pre`` guardrail in the mounted policy (beside the cache-aware routing
policy), whose webhook (``bench/webhook.py``) allows everything. One request is then sent with
the key and its record read back, so a run whose governance did not take says so before measuring.
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
from dataclasses import dataclass
from pathlib import Path

from bench.ports import free_port
from bench.procs import OPOD, wait_http
from bench.routing import fleet as fleet_mod
from bench.routing import peers
from bench.routing.fleet import Fleet

ORG, TEAM, PROJECT = "acme", "ml", "chat"
SCOPE = f"project:{ORG}/{TEAM}/{PROJECT}"
BUDGET_MICROS = 10**12
"""A million currency units a month: far above what any run spends."""
GUARDRAIL = "screen"


def settings_body(model: str) -> str:
    """The cluster settings (``docs/settings.md``): the model's price, the project's budget, bodies kept."""
    return (
        "prices:\n"
        f"  {model}: {{input_per_million: 0.5, output_per_million: 1.5}}\n"
        "budgets:\n"
        f"  - {{scope: '{SCOPE}', period: month, micros: {BUDGET_MICROS}}}\n"
        "retention:\n"
        "  bodies: true\n"
    )


@dataclass
class Governed:
    key: str
    """The project's API key: what the opod path sends with."""
    webhook: peers.RunningPeer
    check: str
    """What the leader recorded for the checking request (cost, guardrail, kept body)."""

    def stop(self) -> None:
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


def enable(fleet: Fleet, scratch: Path) -> Governed:
    """Turn every area on for ``fleet`` and check one request through it; the webhook runs until ``stop``."""
    ctl(fleet, "orgs", "add", ORG)
    ctl(fleet, "teams", "add", TEAM, "--in", ORG)
    ctl(fleet, "projects", "add", PROJECT, "--in", f"{ORG}/{TEAM}")
    key = json.loads(ctl(fleet, "keys", "create", "compare-bench", "--project", f"{ORG}/{TEAM}/{PROJECT}", "--json"))[
        "secret"
    ]
    body = scratch / "settings.yaml"
    body.write_text(settings_body(fleet_mod.MODEL))
    ctl(fleet, "settings", "edit", "--file", str(body), "--base", "0", "--note", "compare benchmark: governance on")
    webhook = start_webhook(scratch)
    try:
        policy = {
            **fleet_mod.PREFIX_POLICY,
            "guardrails": [{"id": GUARDRAIL, "phase": "pre", "url": webhook.url + "/screen"}],
        }
        fleet.set_policy(policy, f"governed-{secrets.token_hex(3)}")
        check = _check(fleet, key)
    except BaseException:
        webhook.stop()
        raise
    return Governed(key, webhook, check)


def _admin_get(fleet: Fleet, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(fleet.admin_url + path, headers={"Authorization": f"Bearer {fleet.key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {}


def _check(fleet: Fleet, key: str, timeout: float = 30.0) -> str:
    """One chat with the project's key; its record must show a cost, the guardrail's allow and a kept body."""
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
    record: dict = {}
    kept = 0
    while time.monotonic() < deadline:
        status, record = _admin_get(fleet, f"/api/v1/requests/{request_id}")
        kept, _ = _admin_get(fleet, f"/api/v1/requests/{request_id}/body")
        if status == 200 and record.get("cost_micros") and record.get("guard_action") and kept == 200:
            break
        time.sleep(0.3)
    else:
        raise RuntimeError(
            f"governance did not take on the check request {request_id}: record {record or 'absent'}, body answered {kept}"
        )
    return (
        f"check request {request_id}: project {record.get('project_id')}, cost {record['cost_micros']} micros, "
        f"guardrail {record.get('guard_policy')} {record['guard_action']} in {record.get('guard_ms', 0)} ms, body kept"
    )
