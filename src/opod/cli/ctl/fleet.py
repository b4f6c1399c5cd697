"""``opod ctl summary``, ``opod ctl nodes …`` and ``opod ctl agents restart``: the fleet as the leader sees it."""

from __future__ import annotations

import typer
from rich.markup import escape

from opod.cli.common import out
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.contract.admin.fleet import (
    AgentRestartView,
    LogsView,
    NodeEngineRequest,
    NodeLabelsRequest,
    NodeLabelsView,
    NodeRemoved,
    NodeStateRequest,
    NodeStateView,
    NodeView,
    Summary,
    UpgradeRequest,
    UpgradeView,
)

nodes = typer.Typer(
    help="Nodes: list, show, cordon or drain, label, read logs, choose engine builds, upgrade, remove.",
    no_args_is_help=True,
)
agents = typer.Typer(help="The node agents (the workers' own processes).", no_args_is_help=True)

NODE = typer.Argument(..., metavar="NODE", help="A node id (opod ctl nodes ls).")


def summary(as_json: bool = render.json_option()) -> None:
    """The fleet at a glance: nodes by state, GPUs by class, fabrics, replicas, models short of replicas, parked and idle ones."""
    body = request("GET", path("summary"))
    if as_json:
        return emit_json(body)
    view = parse(Summary, body, "GET /api/v1/summary")
    n = view.nodes
    if n is not None:
        out.print(
            f"[bold]nodes[/] {n.total or 0}: {n.ready or 0} ready, {n.cordoned or 0} cordoned, "
            f"{n.draining or 0} draining, {n.unreachable or 0} unreachable"
        )
    if (r := view.replicas) is not None:
        out.print(
            f"[bold]replicas[/] {r.ready or 0} ready, {r.starting or 0} starting, {r.draining or 0} draining, {r.failed or 0} failed"
        )
    if (m := view.models) is not None:
        out.print(
            f"[bold]models[/] {m.total or 0}: {m.satisfied or 0} with the replicas they want, {m.short or 0} short"
        )
    if view.gpus:
        gpus = render.table("GPU CLASS", "TOTAL", "USED", "UNHEALTHY")
        for use in view.gpus:
            gpus.add_row(use.class_ or render.DASH, str(use.total or 0), str(use.used or 0), str(use.unhealthy or 0))
        render.show(gpus)
    if view.fabrics:
        fabrics = render.table("FABRIC", "NODES", "FREE BLOCK", "WITH WEIGHTS", "MODELS")
        for f in view.fabrics:
            fabrics.add_row(
                f.fabric or render.DASH,
                str(f.nodes or 0),
                str(f.largest_free_block or 0),
                str(f.nodes_with_weights or 0),
                str(f.models_present or 0),
            )
        render.show(fabrics)
    if view.unplaceable:
        out.print(f"[bold]unplaceable[/] {escape(', '.join(view.unplaceable))} (opod ctl explain MODEL says why)")
    if view.parked:
        parked = render.table("PARKED MODEL", "FAILURES", "REASON", wrap=["REASON"])
        for p in view.parked:
            parked.add_row(p.model or render.DASH, str(p.failures or 0), p.reason or render.DASH)
        render.show(parked)
        render.note("opod ctl models retry MODEL starts a parked model again")
    if view.idle_replicas:
        idle = render.table("IDLE REPLICA", "MODEL", "IDLE", "GPUS")
        for i in view.idle_replicas:
            idle.add_row(i.id or render.DASH, i.model or render.DASH, f"{i.idle_seconds or 0}s", str(i.gpus or 0))
        render.show(idle)
    if view.store:
        store = render.table("STORE", "HOST", "ROLE", "STATE", "LAG")
        for s in view.store:
            store.add_row(
                s.name or render.DASH,
                s.host or render.DASH,
                s.role or render.DASH,
                s.state or render.DASH,
                render.text(s.lag),
            )
        render.show(store)
    if view.store_error:
        out.print(f"[red]store:[/] {escape(view.store_error)}")
    if view.control_planes and view.control_planes.members:
        planes = render.table("CONTROL PLANE", "ADDRESS", "STATE", "THIS")
        for c in view.control_planes.members:
            planes.add_row(
                c.name or render.DASH, c.address or render.DASH, c.state or render.DASH, "yes" if c.this else ""
            )
        render.show(planes)
    if view.stopped:
        out.print("[yellow]placement is stopped: the reconciler starts and stops no replicas[/]")
    if view.guard_off:
        out.print("[yellow]the guard is off[/]")
    if view.version:
        render.note(f"leader version {view.version}")


def _gpus(node: NodeView) -> str:
    """``2/8 free H100``, a line per class; the totals when the node reports no classes."""
    if node.gpus_by_class:
        return "\n".join(
            f"{c.free or 0}/{c.total or 0} free {c.class_ or '?'}{' (MIG)' if c.mig else ''}"
            + (f", {c.unhealthy} unhealthy" if c.unhealthy else "")
            for c in node.gpus_by_class
        )
    if node.gpu_total:
        return f"{node.gpu_free or 0}/{node.gpu_total} free"
    return render.DASH


@nodes.command("ls")
def list_nodes(as_json: bool = render.json_option()) -> None:
    """Every node: its state, GPUs free by class, CPU, memory, disk, engines, replicas and when it was last heard from."""
    body = request("GET", path("nodes"))
    if as_json:
        return emit_json(body)
    rows = parse_list(NodeView, body, "GET /api/v1/nodes")
    shown = render.table(
        "NODE",
        "STATE",
        "HOST",
        "GPUS",
        "CPU",
        "MEMORY",
        "DISK FREE",
        "ENGINES",
        "REPLICAS",
        "SEEN",
        "WARNINGS",
        wrap=["WARNINGS", "STATE"],
    )
    for node in rows:
        state = node.state or render.DASH
        if node.held:
            state += f" (held: {node.held})"
        shown.add_row(
            node.id or render.DASH,
            state,
            node.hostname or render.DASH,
            _gpus(node),
            render.text(node.cpu_count),
            f"{node.memory_gb} GiB" if node.memory_gb is not None else render.DASH,
            f"{node.disk_free_gb} GiB" if node.disk_free_gb is not None else render.DASH,
            render.text(node.engines),
            render.text(node.replicas),
            node.last_seen_ago or render.DASH,
            "\n".join(node.warnings or []) or render.DASH,
        )
    render.show(shown)
    if not rows:
        render.note("no nodes yet: opod token create --node, then on another machine opod join URL --token T")


@nodes.command("show")
def show_node(node: str = NODE, as_json: bool = render.json_option()) -> None:
    """One node in full: machine, labels, location, GPUs, engines and their builds, models on disk, load, warnings."""
    body = request("GET", path("nodes"))
    found = [row for row in body if isinstance(row, dict) and row.get("id") == node] if isinstance(body, list) else []
    if not found:
        known = ", ".join(str(row.get("id")) for row in body if isinstance(row, dict)) if isinstance(body, list) else ""
        raise typer.BadParameter(f"no node {node!r}; the leader knows: {known or 'none'}", param_hint="NODE")
    if as_json:
        return emit_json(found[0])
    view = parse(NodeView, found[0], "GET /api/v1/nodes")
    location = view.location.model_dump(exclude_none=True) if view.location else None
    load = view.load
    render.show(
        render.pairs(
            [
                ("node", view.id),
                ("state", view.state),
                ("host", view.hostname),
                ("address", view.mgmt_addr),
                ("os", view.os),
                ("agent", view.agent_version),
                ("last seen", view.last_seen_ago),
                ("held", view.held),
                ("held by", view.held_domain),
                ("cpus", view.cpu_count),
                ("memory", f"{view.memory_gb} GiB" if view.memory_gb is not None else None),
                ("disk", f"{view.disk_free_gb}/{view.disk_total_gb} GiB free" if view.disk_total_gb else None),
                ("gpus", _gpus(view) if view.gpu_total or view.gpus_by_class else None),
                ("compute", view.compute_capabilities),
                ("unhealthy gpus", view.unhealthy_gpus),
                ("labels", view.labels),
                ("operator labels", view.operator_labels),
                ("location", location),
                ("engines", view.engines),
                ("engine versions", view.engine_versions),
                ("engine builds", view.engine_builds),
                ("multi-node", view.multi_node),
                ("fabrics", view.fabrics),
                ("nvlink domain", view.nvlink_domain),
                ("models on disk", view.models_on_disk),
                ("replicas", view.replicas),
                ("features", view.features),
                (
                    "load",
                    f"cpu {load.cpu_percent or 0:g}%, load {load.load1 or 0:g}/{load.load5 or 0:g}/{load.load15 or 0:g}, "
                    f"memory {render.size(load.memory_used_bytes)} of {render.size(load.memory_total_bytes)}"
                    if load
                    else None,
                ),
                ("warnings", view.warnings),
            ]
        )
    )
    if view.gpus:
        gpus = render.table(
            "GPU", "NAME", "CLASS", "MEMORY", "COMPUTE", "MIG", "NUMA", "NIC", "NVLINK PEERS", "NVLINK DOMAIN"
        )
        for g in view.gpus:
            memory = f"{g.memory_used_mb or 0}/{g.memory_total_mb} MiB" if g.memory_total_mb else render.DASH
            domain = (
                f"{g.domain} ({g.fabric_state})"
                if g.domain and g.fabric_state
                else g.domain or g.fabric_state or render.DASH
            )
            gpus.add_row(
                g.label or render.text(g.index),
                g.name or render.DASH,
                g.class_ or render.DASH,
                memory,
                g.compute_capability or render.DASH,
                g.mig_profile or render.DASH,
                render.text(g.numa),
                g.nearest_nic or render.DASH,
                render.text(g.nvlink_peers),
                domain,
            )
        render.show(gpus)
    if view.provision:
        installs = render.table("ENGINE", "VERSION", "VARIANT", "STATE", "DETAIL", wrap=["DETAIL"])
        for p in view.provision:
            installs.add_row(
                p.engine or render.DASH,
                p.version or render.DASH,
                p.variant or render.DASH,
                p.state or render.DASH,
                p.detail or render.DASH,
            )
        render.show(installs)


@nodes.command("state")
def set_state(
    node: str = NODE,
    state: str = typer.Argument(
        ..., metavar="STATE", help="ready (or uncordon), cordon (or cordoned), drain (or draining)."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Cordon a node (no new replicas), drain it (its replicas move off), or make it ready again."""
    body = request("POST", path("nodes", node, "state"), wire(NodeStateRequest(state=state)))
    if as_json:
        return emit_json(body)
    view = parse(NodeStateView, body, "POST /api/v1/nodes/{id}/state")
    render.line(f"{view.id or node}: {view.state or state}")


@nodes.command("labels")
def set_labels(
    node: str = NODE,
    set_: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="An operator label to set (repeat for more)."
    ),
    remove: list[str] = typer.Option(
        [], "--remove", metavar="KEY", help="An operator label to remove (repeat for more)."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Set or remove operator labels; llmgw.io/site, room, row, rack and pdu place the node in the facility."""
    request_body = NodeLabelsRequest(set=render.key_values(set_, "--set") or None, remove=remove or None)
    body = request("POST", path("nodes", node, "labels"), wire(request_body))
    if as_json:
        return emit_json(body)
    view = parse(NodeLabelsView, body, "POST /api/v1/nodes/{id}/labels")
    render.show(
        render.pairs(
            [
                ("node", view.id or node),
                ("operator labels", view.operator_labels or "none"),
                ("labels", view.labels),
                ("location", view.location.model_dump(exclude_none=True) if view.location else None),
            ]
        )
    )


@nodes.command("logs")
def logs(
    node: str = NODE,
    lines: int | None = typer.Option(
        None, "--lines", "-n", help="How many of the last lines [default: 300, at most 2000]."
    ),
    source: str | None = typer.Option(
        None, "--source", help="agent, or an engine [default: the agent]; the answer lists them."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """The last lines of the node agent's log, or of one of its engines'."""
    body = request("GET", path("nodes", node, "logs"), query={"lines": lines, "source": source})
    if as_json:
        return emit_json(body)
    view = parse(LogsView, body, "GET /api/v1/nodes/{id}/logs")
    for line in view.lines or []:
        typer.echo(line)
    if view.error:
        render.err_note(f"{view.node or node} ({view.source or 'agent'}): {view.error}")
    if view.sources:
        render.err_note(f"sources: {', '.join(view.sources)} (--source NAME)")


@nodes.command("engines")
def engines(
    node: str = NODE,
    engine: str = typer.Argument(..., metavar="ENGINE", help="The engine: vllm, sglang, llamacpp, ollama, sim."),
    build: str = typer.Option(
        "auto", "--build", metavar="BUILD", help="auto (chosen from the node's GPUs and driver), cu129, or none."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Choose which build of an engine a node installs (or none, to keep it off that node)."""
    body = request("POST", path("nodes", node, "engines"), wire(NodeEngineRequest(engine=engine, build=build)))
    if as_json:
        return emit_json(body)
    view = parse(NodeEngineRequest, body, "POST /api/v1/nodes/{id}/engines")
    render.line(f"{node}: {view.engine or engine} build {view.build or build}")


@nodes.command("upgrade")
def upgrade(
    node: str = NODE,
    version: str = typer.Argument(..., metavar="VERSION", help="The agent version to run."),
    as_json: bool = render.json_option(),
) -> None:
    """Upgrade a node's agent; its engines keep serving while the agent restarts."""
    body = request("POST", path("nodes", node, "upgrade"), wire(UpgradeRequest(version=version)))
    if as_json:
        return emit_json(body)
    view = parse(UpgradeView, body, "POST /api/v1/nodes/{id}/upgrade")
    render.line(f"{view.node or node}: upgrading to {view.version or version}")


@nodes.command("rm")
def remove(node: str = NODE, as_json: bool = render.json_option()) -> None:
    """Forget a node: only a lost one, or an unreachable one with nothing placed on it."""
    body = request("DELETE", path("nodes", node))
    if as_json:
        return emit_json(body)
    view = parse(NodeRemoved, body, "DELETE /api/v1/nodes/{id}")
    render.line(f"removed {view.id or node}")


@agents.command("restart")
def restart_agents(as_json: bool = render.json_option()) -> None:
    """Restart every node's agent; the engines keep serving meanwhile."""
    body = request("POST", path("agents", "restart"))
    if as_json:
        return emit_json(body)
    view = parse(AgentRestartView, body, "POST /api/v1/agents/restart")
    render.line(
        f"restarting the agents of {render.count(len(view.nodes or []), 'node')}: {', '.join(view.nodes or []) or 'none'}"
    )
