"""``opod ctl users …``, ``opod ctl keys …`` and ``opod ctl secrets set``: who may use the fleet, and with what."""

from __future__ import annotations

import sys
from datetime import datetime

import typer

from opod.cli.common import err
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.contract.admin.accounts import AccountChange, AccountRequest, PasswordRequest, PasswordSet
from opod.contract.admin.tenancy import (
    KeyCreated,
    KeyCreateRequest,
    KeyView,
    MembershipRequest,
    SecretRequest,
    UserView,
)

users = typer.Typer(
    help="People (they arrive through SCIM or sign-in): list, show, grant or revoke a membership.", no_args_is_help=True
)
keys = typer.Typer(
    help="API keys for /v1: a project's, a person's in a project, or a person's own.", no_args_is_help=True
)
secrets = typer.Typer(help="Secrets kept in the store, for settings to name as store:auth/NAME.", no_args_is_help=True)

USER = typer.Argument(..., metavar="USER", help="A person's ID or email (opod ctl users ls).")
TARGET = typer.Argument(..., metavar="TARGET", help="org:NAME, team:ORG/TEAM or project:ORG/TEAM/PROJECT (or an ID).")


def when(at: datetime | None) -> str:
    """A time as people read it in a table: to the second, in UTC."""
    return at.strftime("%Y-%m-%d %H:%M:%S") if at is not None else render.DASH


def _memberships(user: UserView) -> str:
    return "\n".join(f"{m.path or m.target} ({m.role})" for m in user.memberships or []) or render.DASH


@users.command("ls")
def list_users(
    state: str | None = typer.Option(None, "--state", help="Only people in this state: pending, active or disabled."),
    as_json: bool = render.json_option(),
) -> None:
    """Everyone, with their own role and where each is a member."""
    body = request("GET", path("users"), query={"state": state})
    if as_json:
        return emit_json(body)
    rows = parse_list(UserView, body, "GET /api/v1/users")
    shown = render.table("ID", "EMAIL", "NAME", "STATE", "ROLE", "MEMBER OF", "LAST LOGIN", wrap=["MEMBER OF"])
    for u in rows:
        shown.add_row(
            u.id or render.DASH,
            u.email or render.DASH,
            u.name or render.DASH,
            u.state or render.DASH,
            u.role or render.DASH,
            _memberships(u),
            when(u.last_login_at),
        )
    render.show(shown)
    if not rows:
        render.note("no people yet: they arrive through SCIM provisioning (opod ctl secrets set scim-token) or sign-in")


def _show_user(user: UserView) -> None:
    render.show(
        render.pairs(
            [
                ("id", user.id),
                ("email", user.email),
                ("name", user.name),
                ("state", user.state),
                ("role", user.role),
                ("created", when(user.created_at) if user.created_at else None),
                ("last login", when(user.last_login_at) if user.last_login_at else None),
            ]
        )
    )
    if user.memberships:
        shown = render.table("MEMBER OF", "PATH", "ROLE", "SINCE", "BY")
        for m in user.memberships:
            shown.add_row(
                m.target or render.DASH, m.path or render.DASH, m.role or render.DASH, when(m.at), m.by or render.DASH
            )
        render.show(shown)


@users.command("show")
def show_user(user: str = USER, as_json: bool = render.json_option()) -> None:
    """One person: state, role, memberships."""
    body = request("GET", path("users", user))
    if as_json:
        return emit_json(body)
    _show_user(parse(UserView, body, "GET /api/v1/users/{id}"))


@users.command("grant")
def grant(
    user: str = USER,
    target: str = TARGET,
    role: str = typer.Option("member", "--role", help="member or manager (granting again changes the role)."),
    as_json: bool = render.json_option(),
) -> None:
    """Make a person a member (or manager) of an organization, team or project."""
    body = request("POST", path("users", user, "memberships"), wire(MembershipRequest(target=target, role=role)))
    if as_json:
        return emit_json(body)
    _show_user(parse(UserView, body, "POST /api/v1/users/{id}/memberships"))


@users.command("revoke")
def revoke_membership(user: str = USER, target: str = TARGET, as_json: bool = render.json_option()) -> None:
    """End a membership; the person's keys in projects no longer reachable are revoked."""
    body = request("DELETE", path("users", user, "memberships"), wire(MembershipRequest(target=target)))
    if as_json:
        return emit_json(body)
    _show_user(parse(UserView, body, "DELETE /api/v1/users/{id}/memberships"))


def _password(from_stdin: bool) -> str:
    """A new password: the first line of stdin, or asked twice without echo."""
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    return str(typer.prompt("Password", hide_input=True, confirmation_prompt=True))


PASSWORD_STDIN = typer.Option(False, "--password-stdin", help="Read the password from the first line of stdin.")


@users.command("add")
def add_user(
    email: str = typer.Argument(..., metavar="EMAIL", help="The address the person signs in with."),
    name: str = typer.Option("", "--name", help="Their name, as pages show it."),
    role: str = typer.Option("", "--role", help="viewer, operator, billing or admin; none uses the fleet only."),
    password_stdin: bool = PASSWORD_STDIN,
    as_json: bool = render.json_option(),
) -> None:
    """Make a local account with a password (the first admin: --role admin); they sign in at /signin."""
    order = AccountRequest(email=email, name=name, role=role, password=_password(password_stdin))
    body = request("POST", path("accounts"), wire(order))
    if as_json:
        return emit_json(body)
    _show_user(parse(UserView, body, "POST /api/v1/accounts"))


@users.command("password")
def set_password(user: str = USER, password_stdin: bool = PASSWORD_STDIN) -> None:
    """Set or reset a person's local password; their sessions end."""
    body = request("PUT", path("accounts", user, "password"), wire(PasswordRequest(password=_password(password_stdin))))
    render.note(f"password set for {parse(PasswordSet, body, 'PUT /api/v1/accounts/{id}/password').id}")


@users.command("set")
def change_user(
    user: str = USER,
    role: str | None = typer.Option(None, "--role", help="viewer, operator, billing, admin, or '' for none."),
    state: str | None = typer.Option(None, "--state", help="active, or disabled (their sessions end at once)."),
    as_json: bool = render.json_option(),
) -> None:
    """Change a person's role or state."""
    body = request("PUT", path("accounts", user), wire(AccountChange(role=role, state=state)))
    if as_json:
        return emit_json(body)
    _show_user(parse(UserView, body, "PUT /api/v1/accounts/{id}"))


def _key_rows(rows: list[KeyView]) -> None:
    shown = render.table("ID", "NAME", "PREFIX", "PROJECT", "USER", "BAND", "ROUTING", "STATE", "EXPIRES", "LAST USED")
    for k in rows:
        shown.add_row(
            k.id or render.DASH,
            k.name or render.DASH,
            k.prefix or render.DASH,
            k.project_path or k.project or render.DASH,
            k.user_email or k.user or render.DASH,
            k.band or render.DASH,
            k.routing_profile or render.DASH,
            k.state or render.DASH,
            when(k.expires_at),
            when(k.last_used_at),
        )
    render.show(shown)


@keys.command("ls")
def list_keys(
    project: str | None = typer.Option(None, "--project", help="Only this project's keys: ORG/TEAM/PROJECT or its ID."),
    as_json: bool = render.json_option(),
) -> None:
    """Every API key with its project and owner; never the keys themselves."""
    body = request("GET", path("keys"), query={"project": project})
    if as_json:
        return emit_json(body)
    rows = parse_list(KeyView, body, "GET /api/v1/keys")
    _key_rows(rows)
    if not rows:
        render.note("no keys yet: opod ctl keys create NAME --project ORG/TEAM/PROJECT")


@keys.command("create")
def create_key(
    name: str = typer.Argument(..., metavar="NAME", help="What the key is for."),
    project: str | None = typer.Option(None, "--project", help="The project: ORG/TEAM/PROJECT or its ID."),
    user: str | None = typer.Option(None, "--user", help="The person it belongs to: ID or email."),
    band: str | None = typer.Option(None, "--band", help="Its admission class (band)."),
    routing_profile: str | None = typer.Option(None, "--routing-profile", help="A routing profile of the policy."),
    expires_in: str | None = typer.Option(
        None, "--expires-in", help="A lifetime like 720h, or none; bounded by every scope above."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Issue an API key; the key is printed once, only its hash is kept."""
    asked = KeyCreateRequest(
        name=name, project=project, user=user, band=band, routing_profile=routing_profile, expires_in=expires_in
    )
    body = request("POST", path("keys"), wire(asked))
    if as_json:
        return emit_json(body)
    created = parse(KeyCreated, body, "POST /api/v1/keys")
    where = created.project_path or created.project
    err.print(
        f"created key {created.id}"
        + (f" in {where}" if where else "")
        + (f" for {created.user_email or created.user}" if created.user else "")
        + (f", expires {when(created.expires_at)}" if created.expires_at else "")
        + ".",
        markup=False,
        highlight=False,
    )
    typer.echo(created.secret or "")
    err.print("This key is not shown again: only its hash is kept. Keep it now.", markup=False, highlight=False)


@keys.command("show")
def show_key(
    key: str = typer.Argument(..., metavar="ID", help="The key's ID (opod ctl keys ls)."),
    as_json: bool = render.json_option(),
) -> None:
    """One key: project, owner, band, routing profile, state, when it expires and was last used."""
    body = request("GET", path("keys", key))
    if as_json:
        return emit_json(body)
    k = parse(KeyView, body, "GET /api/v1/keys/{id}")
    render.show(
        render.pairs(
            [
                ("id", k.id),
                ("name", k.name),
                ("prefix", k.prefix),
                ("project", k.project_path or k.project),
                ("project id", k.project),
                ("user", k.user_email or k.user),
                ("band", k.band),
                ("routing profile", k.routing_profile),
                ("state", k.state),
                ("created", when(k.created_at) if k.created_at else None),
                ("expires", when(k.expires_at) if k.expires_at else None),
                ("revoked", when(k.revoked_at) if k.revoked_at else None),
                ("last used", when(k.last_used_at) if k.last_used_at else None),
            ]
        )
    )


@keys.command("revoke")
def revoke_key(
    key: str = typer.Argument(..., metavar="ID", help="The key's ID (opod ctl keys ls)."),
    as_json: bool = render.json_option(),
) -> None:
    """Revoke a key: refused on /v1 from the next request on."""
    body = request("DELETE", path("keys", key))
    if as_json:
        return emit_json(body)
    render.line(f"revoked {key}")


@secrets.command("set")
def set_secret(
    name: str = typer.Argument(..., metavar="NAME", help="ldap-bind, oidc-client-secret or scim-token."),
    as_json: bool = render.json_option(),
) -> None:
    """Keep a secret in the store; the value is read from standard input, or asked for without echo (never an argument)."""
    if sys.stdin.isatty():
        value = typer.prompt(f"value of {name}", hide_input=True, confirmation_prompt=True)
    else:
        value = sys.stdin.read().rstrip("\r\n")
    if not value:
        raise typer.BadParameter(
            "the value is empty; pipe it on standard input or type it at the prompt", param_hint="NAME"
        )
    body = request("PUT", path("auth", "secrets", name), wire(SecretRequest(value=value)))
    if as_json:
        return emit_json(body)
    reference = body.get("reference") if isinstance(body, dict) else None
    render.line(f"stored {name}; settings name it as {reference or f'store:auth/{name}'}")
