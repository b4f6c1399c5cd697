"""``opod ctl federation …``: other opod clusters as providers, their models offered here as ``PEER/MODEL``."""

from __future__ import annotations

import typer

from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, path, request, wire
from opod.contract.admin.common import Removed
from opod.contract.admin.services import FederationAddRequest, FederationStatus, FederationView

federation = typer.Typer(
    help="Federation peers: other opod clusters whose models this one offers as PEER/MODEL.", no_args_is_help=True
)
PEER = typer.Argument(..., metavar="PEER", help="The peer's name here (opod ctl federation ls).")


def _state(peer: FederationStatus) -> str:
    if peer.up:
        return f"up ({peer.latency_ms:g} ms)" if peer.latency_ms is not None else "up"
    return f"down: {peer.error}" if peer.error else "not checked yet"


def _models(peer: FederationStatus) -> str:
    names = [m.name + (" (withdrawn)" if m.withdrawn else "") for m in peer.models or [] if m.name]
    return ", ".join(names) or render.DASH


@federation.command("ls")
def list_peers(as_json: bool = render.json_option()) -> None:
    """This cluster's id, and each peer: its address, state, the peer's own cluster id and its models."""
    body = request("GET", path("federation"))
    if as_json:
        return emit_json(body)
    view = parse(FederationView, body, "GET /api/v1/federation")
    render.line(f"this cluster: {view.cluster}")
    shown = render.table("PEER", "URL", "STATE", "CLUSTER", "MODELS", wrap=["MODELS", "STATE"])
    for peer in view.peers or []:
        shown.add_row(peer.name, peer.url, _state(peer), peer.cluster or render.DASH, _models(peer))
    render.show(shown)
    if not view.peers:
        render.note("no peers: opod ctl federation add NAME URL --key-file FILE adds one")


@federation.command("add")
def add_peer(
    name: str = typer.Argument(
        ..., metavar="NAME", help="What this cluster calls the peer: its models are NAME/MODEL."
    ),
    url: str = typer.Argument(..., metavar="URL", help="The peer's client address, without /v1."),
    key_file: str = typer.Option(
        ...,
        "--key-file",
        help="Where the key the peer issued to this cluster is: a file, env:NAME or vault:PATH#FIELD.",
    ),
    send_tags: bool = typer.Option(
        False, "--send-tags", help="Tell the peer which cluster and project each request comes from."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Add a peer (or change one): it is checked first, and kept only when it answers."""
    body = request(
        "POST",
        path("federation"),
        wire(FederationAddRequest(name=name, url=url, key_file=key_file, send_tags=send_tags)),
    )
    if as_json:
        return emit_json(body)
    peer = parse(FederationStatus, body, "POST /api/v1/federation")
    render.line(f"{peer.name}: {_state(peer)}; models {_models(peer)}")


@federation.command("rm")
def remove_peer(peer: str = PEER, as_json: bool = render.json_option()) -> None:
    """Remove a peer and its models (refused while a model here falls back to one of them)."""
    body = request("DELETE", path("federation", peer))
    if as_json:
        return emit_json(body)
    render.line(f"removed {parse(Removed, body, 'DELETE /api/v1/federation/{peer}').removed}")


@federation.command("sync")
def sync_peer(peer: str = PEER, as_json: bool = render.json_option()) -> None:
    """Check a peer now, rather than at the next interval."""
    body = request("POST", path("federation", peer, "sync"))
    if as_json:
        return emit_json(body)
    checked = parse(FederationStatus, body, "POST /api/v1/federation/{peer}/sync")
    render.line(f"{checked.name}: {_state(checked)}; models {_models(checked)}")
