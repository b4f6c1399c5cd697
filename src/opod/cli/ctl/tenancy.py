"""``opod ctl orgs|teams|projects …``: the tenancy tree, organizations over teams over projects."""

from __future__ import annotations

from typing import Any

import typer
from rich.tree import Tree

from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.contract.admin.tenancy import OrgView, TenancyChangeRequest, TenancyCreateRequest, TenancyItem

orgs = typer.Typer(
    help="Organizations: the tenancy tree, add, rename, remove (only when it has no teams).", no_args_is_help=True
)
teams = typer.Typer(
    help="Teams of an organization: add, move to another organization, rename, remove.", no_args_is_help=True
)
projects = typer.Typer(help="Projects of a team: add, move to another team, rename, remove.", no_args_is_help=True)


def _label(name: str | None, ident: str | None, *facts: str) -> str:
    shown = [f for f in facts if f]
    return f"{name or render.DASH} ({ident or '?'})" + (f"  {', '.join(shown)}" if shown else "")


def _tree(rows: list[OrgView]) -> Tree:
    """Organizations, their teams and projects, each with its ID and what it holds."""
    root = Tree("organizations", hide_root=True, guide_style="dim")
    for org in rows:
        org_node = root.add(_label(org.name, org.id, render.count(org.members or 0, "member")))
        for team in org.teams or []:
            team_node = org_node.add(_label(team.name, team.id, render.count(team.members or 0, "member")))
            for project in team.projects or []:
                team_node.add(
                    _label(
                        project.name,
                        project.id,
                        project.path or "",
                        render.count(project.users or 0, "user"),
                        f"{project.active_keys or 0}/{render.count(project.keys or 0, 'key')} active",
                    )
                )
    return root


@orgs.command("ls")
def list_orgs(as_json: bool = render.json_option()) -> None:
    """The tenancy tree: every organization, its teams and their projects, with members and keys."""
    body = request("GET", path("orgs"))
    if as_json:
        return emit_json(body)
    rows = parse_list(OrgView, body, "GET /api/v1/orgs")
    if not rows:
        render.note("no organizations yet: opod ctl orgs add NAME")
        return
    render.show(_tree(rows))


def _created(kind: str, body: Any, as_json: bool) -> None:
    if as_json:
        return emit_json(body)
    item = parse(TenancyItem, body, f"POST /api/v1/{kind}s")
    render.line(f"created {kind} {item.name} ({item.id})" + (f" in {item.in_}" if item.in_ else ""))


def _changed(kind: str, ident: str, change: TenancyChangeRequest, as_json: bool) -> None:
    body = request("PATCH", path(f"{kind}s", ident), wire(change))
    if as_json:
        return emit_json(body)
    item = parse(TenancyItem, body, f"PATCH /api/v1/{kind}s/{{id}}")
    render.line(f"{kind} {item.id or ident}: {item.name or render.DASH}" + (f" in {item.in_}" if item.in_ else ""))


def _removed(kind: str, ident: str, as_json: bool) -> None:
    body = request("DELETE", path(f"{kind}s", ident))
    if as_json:
        return emit_json(body)
    render.line(f"removed {kind} {ident}")


NAME = typer.Argument(..., metavar="NAME", help="The name to give it.")


@orgs.command("add")
def add_org(name: str = NAME, as_json: bool = render.json_option()) -> None:
    """Add an organization."""
    _created("org", request("POST", path("orgs"), wire(TenancyCreateRequest(name=name))), as_json)


@orgs.command("rename")
def rename_org(
    ident: str = typer.Argument(..., metavar="ORG", help="The organization's ID or name."),
    name: str = NAME,
    as_json: bool = render.json_option(),
) -> None:
    """Rename an organization."""
    _changed("org", ident, TenancyChangeRequest(name=name), as_json)


@orgs.command("rm")
def remove_org(
    ident: str = typer.Argument(..., metavar="ORG", help="The organization's ID or name."),
    as_json: bool = render.json_option(),
) -> None:
    """Remove an organization that has no teams."""
    _removed("org", ident, as_json)


TEAM = typer.Argument(..., metavar="TEAM", help="The team's ID (opod ctl orgs ls).")
PROJECT = typer.Argument(..., metavar="PROJECT", help="The project's ID (opod ctl orgs ls).")


@teams.command("add")
def add_team(
    name: str = NAME,
    parent: str = typer.Option(..., "--in", metavar="ORG", help="The organization: its name or ID."),
    as_json: bool = render.json_option(),
) -> None:
    """Add a team to an organization."""
    _created("team", request("POST", path("teams"), wire(TenancyCreateRequest(name=name, in_=parent))), as_json)


@teams.command("mv")
def move_team(
    ident: str = TEAM,
    parent: str = typer.Option(..., "--in", metavar="ORG", help="The organization to move it to."),
    as_json: bool = render.json_option(),
) -> None:
    """Move a team to another organization (it takes on that organization's limits)."""
    _changed("team", ident, TenancyChangeRequest(in_=parent), as_json)


@teams.command("rename")
def rename_team(ident: str = TEAM, name: str = NAME, as_json: bool = render.json_option()) -> None:
    """Rename a team."""
    _changed("team", ident, TenancyChangeRequest(name=name), as_json)


@teams.command("rm")
def remove_team(ident: str = TEAM, as_json: bool = render.json_option()) -> None:
    """Remove a team that has no projects."""
    _removed("team", ident, as_json)


@projects.command("add")
def add_project(
    name: str = NAME,
    parent: str = typer.Option(..., "--in", metavar="ORG/TEAM", help="The team: ORG/TEAM or its ID."),
    as_json: bool = render.json_option(),
) -> None:
    """Add a project to a team."""
    _created("project", request("POST", path("projects"), wire(TenancyCreateRequest(name=name, in_=parent))), as_json)


@projects.command("mv")
def move_project(
    ident: str = PROJECT,
    parent: str = typer.Option(..., "--in", metavar="ORG/TEAM", help="The team to move it to."),
    as_json: bool = render.json_option(),
) -> None:
    """Move a project to another team."""
    _changed("project", ident, TenancyChangeRequest(in_=parent), as_json)


@projects.command("rename")
def rename_project(ident: str = PROJECT, name: str = NAME, as_json: bool = render.json_option()) -> None:
    """Rename a project."""
    _changed("project", ident, TenancyChangeRequest(name=name), as_json)


@projects.command("rm")
def remove_project(ident: str = PROJECT, as_json: bool = render.json_option()) -> None:
    """Remove a project with no people, keys or collections (one that ever had a key can only be renamed)."""
    _removed("project", ident, as_json)
