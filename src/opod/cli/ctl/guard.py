"""``opod ctl guard show|attach|detach|events``: the guard library, where its policies are attached, what it did.

The policies themselves are the settings' ``guard:`` section (``opod ctl settings edit``); these commands show
them, attach one to an organization, team, project, person or key, and read what the guards did to requests.
"""

from __future__ import annotations

import typer

from opod.cli.common import out
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, path, request, wire
from opod.cli.ctl.people import when
from opod.contract.admin.services import (
    GuardAttachment,
    GuardAttachmentRequest,
    GuardEventsView,
    GuardPolicyView,
    GuardView,
)

guard = typer.Typer(
    help="The guard library: the settings' policies, where they are attached, and what they did to requests.",
    no_args_is_help=True,
)

TARGET = typer.Argument(
    ...,
    metavar="TARGET",
    help="org:NAME, team:ORG/TEAM, project:ORG/TEAM/PROJECT (or an ID after the colon), user:ID|EMAIL or key:ID.",
)
POLICY = typer.Argument(..., metavar="POLICY", help="A policy of the settings' guard.policies (opod ctl guard show).")


def _checks(policy: GuardPolicyView) -> str:
    """A policy's checks, a line each (``input: pii email → redact``), and its judge when it names one."""
    lines = list(policy.checks or [])
    if policy.judge:
        lines.append(f"judge {policy.judge}")
    return "\n".join(lines) or "none: it checks nothing"


def _scope(scope: str | None, scope_id: str | None) -> str:
    return f"{scope or '?'}:{scope_id or '?'}"


@guard.command("show")
def show(as_json: bool = render.json_option()) -> None:
    """Whether the guard is on, the settings' policies with their checks, the default ones, and the attachments."""
    body = request("GET", path("guard"))
    if as_json:
        return emit_json(body)
    view = parse(GuardView, body, "GET /api/v1/guard")
    known = set(view.policies or [])
    default = set(view.default or [])
    render.show(
        render.pairs(
            [
                ("enabled", "yes" if view.enabled else "no: guard.enabled is false, no policy checks anything"),
                ("default", ", ".join(view.default or []) or "none: only attached policies check requests"),
            ]
        )
    )
    out.print()
    policies = render.table("POLICY", "MODE", "FAIL", "NO STORE", "DEFAULT", "CHECKS", wrap=["CHECKS"])
    for p in view.details or []:
        policies.add_row(
            p.name or render.DASH,
            p.mode or render.DASH,
            p.fail or render.DASH,
            render.text(bool(p.no_store)),
            render.text(p.name in default),
            _checks(p),
        )
    render.show(policies)
    if not view.details:
        render.note("no policies: add them under guard.policies (opod ctl settings edit; docs/settings.md, Guard)")
    out.print()
    attachments = render.table("SCOPE", "NAME", "POLICY")
    for a in view.attachments or []:
        attachments.add_row(_scope(a.Scope, a.ScopeID), a.name or render.DASH, a.Policy or render.DASH)
    render.show(attachments)
    if not view.attachments:
        render.note("no attachments: opod ctl guard attach project:ORG/TEAM/PROJECT POLICY attaches one")
    ignored = sorted({a.Policy for a in view.attachments or [] if a.Policy and a.Policy not in known})
    if ignored:
        render.note(
            f"not in the settings' guard.policies, so ignored: {', '.join(ignored)} "
            "(opod ctl guard detach TARGET POLICY takes them off; putting the policy back brings them back)"
        )


def _change(method: str, target: str, policy: str, as_json: bool) -> GuardAttachment | None:
    body = request(method, path("guard", "attachments"), wire(GuardAttachmentRequest(target=target, policy=policy)))
    if as_json:
        emit_json(body)
        return None
    return parse(GuardAttachment, body, f"{method} /api/v1/guard/attachments")


def _named(target: str, done: GuardAttachment) -> str:
    """``project:acme/ml/chat (project:prj_…)``: the target as written, and by ID when that differs."""
    scope = _scope(done.Scope, done.ScopeID)
    return target if target == scope else f"{target} ({scope})"


@guard.command("attach")
def attach(target: str = TARGET, policy: str = POLICY, as_json: bool = render.json_option()) -> None:
    """Attach a policy of the settings to what TARGET names: its requests are checked by it from the next one on."""
    done = _change("POST", target, policy, as_json)
    if done is not None:
        render.line(f"attached {done.Policy or policy} to {_named(target, done)}")


@guard.command("detach")
def detach(target: str = TARGET, policy: str = POLICY, as_json: bool = render.json_option()) -> None:
    """Take a policy off what TARGET names (a policy no longer in the settings too, and a scope gone by its ID)."""
    done = _change("DELETE", target, policy, as_json)
    if done is not None:
        render.line(f"detached {done.Policy or policy} from {_named(target, done)}")


@guard.command("events")
def events(
    since: str | None = typer.Option(
        None,
        "--since",
        help="A duration back from now (90m, 24h, 7d) or a time (RFC 3339: 2026-03-04T05:06:07Z) [default: 24h].",
    ),
    as_json: bool = render.json_option(),
) -> None:
    """What the guards did: requests counted per project, action, policy and category (allow too), and the newest
    ones they blocked, rewrote or flagged."""
    body = request("GET", path("guard", "events"), query={"since": since})
    if as_json:
        return emit_json(body)
    view = parse(GuardEventsView, body, "GET /api/v1/guard/events")
    since_at = f"since {when(view.since)}" if view.since else "in the time asked"
    if not view.counts and not view.events:
        render.note(f"no requests checked by a guard {since_at}")
        return
    render.line(f"requests checked by a guard {since_at}")
    counts = render.table("PROJECT", "ACTION", "POLICY", "CATEGORY", "REQUESTS")
    for c in view.counts or []:
        counts.add_row(
            c.project or render.DASH,
            c.action or render.DASH,
            c.policy or render.DASH,
            c.category or render.DASH,
            str(c.count or 0),
        )
    render.show(counts)
    out.print()
    if not view.events:
        render.note(f"none blocked, rewritten or flagged {since_at}")
        return
    shown = render.table(
        "AT", "REQUEST", "PROJECT", "MODEL", "STATUS", "ACTION", "POLICY", "CATEGORY", "RULE", "GUARD MS"
    )
    for e in view.events:
        shown.add_row(
            when(e.at),
            e.request_id or render.DASH,
            e.project or render.DASH,
            e.model or render.DASH,
            render.text(e.status),
            e.action or render.DASH,
            e.policy or render.DASH,
            e.category or render.DASH,
            e.rule or render.DASH,
            render.text(e.guard_ms),
        )
    render.show(shown)
