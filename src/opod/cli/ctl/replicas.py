"""``opod ctl replicas``, ``opod ctl restart`` and ``opod ctl explain``: what runs where, rolling restarts, why not placed."""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.markup import escape

from opod.cli.common import console, fail, out
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.contract.admin.fleet import ExplainView, ReplicaView, RestartRequest, RestartResult

POLL_S = 1.0
"""How often a restart's progress is read: often enough to see each replica go, light on the leader."""
"""How long a queued replica may say why its restart waits before the command stops following it: longer than
a replacement takes to free the devices of the replica it took over from."""


def _replicas(model: str | None) -> list[ReplicaView]:
    return parse_list(ReplicaView, request("GET", path("replicas"), query={"model": model}), "GET /api/v1/replicas")


def replicas(
    model: str | None = typer.Option(None, "--model", "-m", metavar="MODEL", help="Only this model's replicas."),
    as_json: bool = render.json_option(),
) -> None:
    """Every replica: its model, profile, state, where its shards run, its age and idle time, a queued restart."""
    body = request("GET", path("replicas"), query={"model": model})
    if as_json:
        return emit_json(body)
    rows = parse_list(ReplicaView, body, "GET /api/v1/replicas")
    shown = render.table(
        "REPLICA", "MODEL", "PROFILE", "STATE", "NODES", "AGE", "IDLE", "RESTART", "ERROR", wrap=["ERROR", "NODES"]
    )
    for r in rows:
        where = "\n".join(
            f"{s.node}"
            + (f" gpus {','.join(map(str, s.gpus))}" if s.gpus else "")
            + (f" ({s.state})" if s.state else "")
            + (
                f" fetching {s.fetch.percent}%"
                if s.fetch and s.fetch.percent is not None and s.fetch.percent < 100
                else ""
            )
            for s in r.shards or []
        )
        state = (r.state or render.DASH) + (" (stale)" if r.stale else "")
        idle = render.DASH if r.idle_seconds is None or r.idle_seconds < 0 else f"{r.idle_seconds}s"
        shown.add_row(
            r.id or render.DASH,
            r.model or render.DASH,
            r.profile or render.DASH,
            state,
            where or render.DASH,
            f"{r.age_seconds}s" if r.age_seconds is not None else render.DASH,
            idle,
            r.restart or render.DASH,
            r.error or render.DASH,
        )
    render.show(shown)
    if not rows:
        render.note(
            "no replicas"
            + (f" of {model}" if model else "")
            + ": opod ctl models ls says what is wanted, opod ctl explain MODEL why not placed"
        )


def restart(
    replica: list[str] = typer.Argument(None, metavar="REPLICA", help="Replicas to restart (opod ctl replicas)."),
    model: list[str] = typer.Option(
        [], "--model", "-m", metavar="MODEL", help="Restart every replica of this model (repeat for more)."
    ),
    everything: bool = typer.Option(False, "--all", help="Restart every replica of every model."),
    max_surge: int | None = typer.Option(
        None, "--max-surge", metavar="N", help="New replicas started ahead of the old ones stopping."
    ),
    max_unavailable: int | None = typer.Option(
        None, "--max-unavailable", metavar="N", help="Replicas that may be down at once."
    ),
    in_place: bool = typer.Option(
        False, "--in-place", help="Restart each replica where it is, instead of starting a new one first."
    ),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Show progress until every queued replica is replaced."),
    timeout: str = typer.Option(
        "30m", "--timeout", metavar="DURATION", help="Stop waiting after this long (the restart goes on)."
    ),
    stuck_after: str = typer.Option(
        "15s",
        "--stuck-after",
        metavar="DURATION",
        help="Stop waiting once a queued replica has said this long why it cannot go on (no room to surge).",
    ),
    as_json: bool = render.json_option(),
) -> None:
    """A rolling restart of replicas, of models, or of all; shows each queued replica as it is replaced."""
    replica = replica or []
    if not (replica or model or everything):
        raise typer.BadParameter("say what to restart: REPLICA ids, --model MODEL, or --all", param_hint="REPLICA")
    limit_s = render.parse_duration(timeout, "--timeout") / 1e9
    stuck_s = render.parse_duration(stuck_after, "--stuck-after") / 1e9
    ask = RestartRequest(
        replicas=replica or None,
        models=model or None,
        all=everything or None,
        in_place=in_place or None,
        max_surge=max_surge,
        max_unavailable=max_unavailable,
    )
    body = request("POST", path("restart"), wire(ask))
    result = parse(RestartResult, body, "POST /api/v1/restart")
    queued = result.queued or []
    if as_json:
        emit_json(body)
    else:
        render.line(
            f"queued {render.count(len(queued), 'replica')} for restart" + (f": {', '.join(queued)}" if queued else "")
        )
    if wait and queued:
        _follow(queued, limit_s, stuck_s, console(stderr=True) if as_json else out)


def _follow(queued: list[str], limit_s: float, stuck_s: float, shown: Console) -> None:
    """Poll the replicas until each of ``queued`` is replaced (or restarted in place) and its model's replicas are ready.

    A line per change, so the progress reads the same in a terminal and in a log. A queued replica that says
    why its restart waits (its ``error``: no room for its replacement) for ``stuck_s`` seconds ends the wait with that
    reason; the restart itself stays queued on the leader.
    """
    deadline = time.monotonic() + limit_s
    seen: dict[str, str] = {}
    waiting_since: dict[str, float] = {}
    done: set[str] = set()
    models: set[str] = set()
    settling = False
    while True:
        now = {r.id: r for r in _replicas(None) if r.id}
        models |= {now[rid].model or "" for rid in queued if rid in now} - {""}
        for rid in queued:
            if rid in done:
                continue
            current = now.get(rid)
            if current is None or not current.restart:
                done.add(rid)
                how = "replaced" if current is None else "restarted in place"
                shown.print(f"[{len(done)}/{len(queued)}] {rid} {how}", markup=False)
                continue
            waits = current.error if current.restart == "queued" and current.state != "failed" else None
            said = current.restart + (f": {waits}" if waits else "")
            if seen.get(rid) != said:
                seen[rid] = said
                shown.print(f"[{len(done)}/{len(queued)}] {rid} {said}", markup=False)
            if not waits:
                waiting_since.pop(rid, None)
            elif time.monotonic() - waiting_since.setdefault(rid, time.monotonic()) >= stuck_s:
                raise fail(
                    escape(
                        f"{rid} is still queued for restart after {stuck_s:g} s: {waits}; the restart stays queued "
                        "and goes on by itself once there is room (opod ctl replicas shows it)"
                    )
                )
        if len(done) == len(queued):
            mine = [r for r in now.values() if r.model in models]
            failed = [r for r in mine if r.state == "failed"]
            if failed:
                raise fail(
                    f"{', '.join(r.id or '' for r in failed)} failed after the restart: "
                    f"{'; '.join(r.error or 'no reason given' for r in failed)} (opod ctl replicas)"
                )
            if {r.model for r in mine if r.state == "ready"} >= models and all(r.state == "ready" for r in mine):
                shown.print(
                    f"done: {render.count(len(queued), 'replica')} restarted; "
                    + ", ".join(f"{m} {sum(r.model == m for r in mine)} ready" for m in sorted(models)),
                    markup=False,
                )
                return
            if not settling:
                settling = True
                shown.print(f"waiting for the new replicas of {', '.join(sorted(models))} to be ready", markup=False)
        if time.monotonic() >= deadline:
            left = [rid for rid in queued if rid not in done]
            what = (
                f"{render.count(len(left), 'replica')} not yet restarted ({', '.join(left)})"
                if left
                else f"the new replicas of {', '.join(sorted(models))} not yet ready"
            )
            raise fail(
                f"after --timeout {render.duration(int(limit_s * 1e9))}, {what}; the restart goes on (opod ctl replicas shows it)"
            )
        time.sleep(POLL_S)


def explain(
    model: str = typer.Argument(..., metavar="MODEL", help="A model's name or alias."),
    as_json: bool = render.json_option(),
) -> None:
    """Why a model is or is not placed: for each node that was rejected, the rule that refused it and by how much."""
    body = request("GET", path("explain-placement"), query={"model": model})
    if as_json:
        return emit_json(body)
    view = parse(ExplainView, body, "GET /api/v1/explain-placement")
    rejections = view.rejections or []
    if view.placed:
        render.line(f"{view.model or model}: placed")
    elif not rejections:
        render.line(
            f"{view.model or model}: not placed, and placement was never attempted (is the model added and wanted?)"
        )
        return
    else:
        render.line(f"{view.model or model}: not placed")
    if rejections:
        shown = render.table("NODE", "PROFILE", "POOL", "WHY NOT", wrap=["WHY NOT"])
        for r in sorted(rejections, key=lambda r: (r.node or "", r.profile or "")):
            shown.add_row(
                r.node or render.DASH, r.profile or render.DASH, r.pool or render.DASH, r.reason or render.DASH
            )
        render.show(shown)
