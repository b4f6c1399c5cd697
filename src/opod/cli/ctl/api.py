"""How ``opod ctl`` talks to the management API: the request, who made it, and what a refusal says.

Every change carries ``Content-Type: application/json`` (the admin listener refuses
one without it, a bodiless POST included) and ``X-Llmgw-Actor`` (the login name,
cut to the characters the listener takes), so the change is recorded as made by
the person at the keyboard. A refusal is the API's ``ErrorView``: its message is
printed as it is, since it names the field and what to do.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from rich.markup import escape

from opod.cli.common import admin_key, admin_url, fail
from opod.contract.admin.common import ErrorView

M = TypeVar("M", bound=BaseModel)

TIMEOUT_S = 60.0
"""Long enough for a collect or a restart to be queued; neither waits for the work itself."""

_NOT_ACTOR = re.compile(r"[^A-Za-z0-9._@-]")


def actor() -> str:
    """The login name as ``X-Llmgw-Actor`` allows it: letters, digits and ``._-@``, at most 64."""
    try:
        name = pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, OSError):
        name = ""
    return _NOT_ACTOR.sub("_", name)[:64] or "unknown"


def path(*segments: str) -> str:
    """``/api/v1/`` and the segments, each quoted (a model name may hold ``:`` or spaces)."""
    return "/api/v1/" + "/".join(urllib.parse.quote(s, safe=":@") for s in segments)


def request(method: str, where: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
    """Call the leader's ``/api/v1``; the parsed JSON answer, or exit 1 with the refusal's message."""
    params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (query or {}).items() if v is not None}
    url = admin_url() + where + (f"?{urllib.parse.urlencode(params)}" if params else "")
    data = json.dumps(body).encode() if body is not None else None
    call = urllib.request.Request(url, data=data, method=method)
    call.add_header("Authorization", f"Bearer {admin_key()}")
    call.add_header("Accept", "application/json")
    if method not in ("GET", "HEAD"):
        call.add_header("Content-Type", "application/json")
        call.add_header("X-Llmgw-Actor", actor())
    try:
        with urllib.request.urlopen(call, timeout=TIMEOUT_S) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        raise fail(escape(refusal(method, where, error.code, error.read().decode(errors="replace")))) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise fail(
            f"cannot reach the leader's admin API at {admin_url()}: {reason}. Is opod up running on this machine? "
            "Set OPOD_ADMIN_URL (and OPOD_ADMIN_KEY) to reach another."
        ) from None
    try:
        return json.loads(text) if text else None
    except ValueError:
        raise fail(f"{method} {where} answered something that is not JSON: {text[:200]!r}") from None


def refusal(method: str, where: str, status: int, text: str) -> str:
    """The line shown for a refused call: the ErrorView's message, and what the status means where it adds something."""
    try:
        message = ErrorView.model_validate_json(text).error or ""
    except ValidationError:
        message = text.strip()
    message = message or f"{method} {where} was refused"
    if status == 501:
        return f"{message} (HTTP 501: this part of the management API is not built in this opod yet)"
    if status == 401:
        return f"{message} (HTTP 401: the admin key was refused; it is in the leader's home as admin.key, or set OPOD_ADMIN_KEY)"
    return f"{message} (HTTP {status})"


def parse(model: type[M], data: Any, what: str) -> M:
    """The answer as its wire type; an answer of another shape exits with what differs (a leader of another version)."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise fail(escape(_shape_error(model, error, what))) from None


def parse_list(model: type[M], data: Any, what: str) -> list[M]:
    if not isinstance(data, list):
        raise fail(f"{what} answered {type(data).__name__}, not a list of {model.__name__}")
    return [parse(model, row, what) for row in data]


def _shape_error(model: type[BaseModel], error: ValidationError, what: str) -> str:
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()[:5])
    return f"{what} answered a shape that is not the spec's {model.__name__} ({problems}); is the leader another opod version?"


def wire(model: BaseModel) -> dict[str, Any]:
    """A request body as the spec writes it: aliases (``class``), no absent fields."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def emit_json(data: Any) -> None:
    """``--json``: the body as the API answered it."""
    typer.echo(json.dumps(data, indent=2))


def _call(
    method: str, where: str, body: Any = None, query: dict[str, Any] | None = None, accept: str = "application/json"
) -> urllib.request.Request:
    params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (query or {}).items() if v is not None}
    url = admin_url() + where + (f"?{urllib.parse.urlencode(params)}" if params else "")
    call = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method)
    call.add_header("Authorization", f"Bearer {admin_key()}")
    call.add_header("Accept", accept)
    if method not in ("GET", "HEAD"):
        call.add_header("Content-Type", "application/json")
        call.add_header("X-Llmgw-Actor", actor())
    return call


def _unreachable(error: BaseException) -> typer.Exit:
    reason = getattr(error, "reason", error)
    return fail(
        f"cannot reach the leader's admin API at {admin_url()}: {reason}. Is opod up running on this machine? "
        "Set OPOD_ADMIN_URL (and OPOD_ADMIN_KEY) to reach another."
    )


def attempt(method: str, where: str, body: Any = None, query: dict[str, Any] | None = None) -> tuple[int, Any]:
    """Like ``request``, but a refusal comes back as ``(status, message line)`` for the caller to add to."""
    try:
        with urllib.request.urlopen(_call(method, where, body, query), timeout=TIMEOUT_S) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        return error.code, refusal(method, where, error.code, error.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError) as error:
        raise _unreachable(error) from None
    except ValueError:
        raise fail(f"{method} {where} answered something that is not JSON") from None


def open_stream(where: str, query: dict[str, Any] | None = None, accept: str = "*/*") -> Any:
    """A GET whose answer is read piece by piece (an export of a year of rows); the response, or exit 1 with the refusal."""
    try:
        return urllib.request.urlopen(_call("GET", where, None, query, accept=accept), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as error:
        raise fail(escape(refusal("GET", where, error.code, error.read().decode(errors="replace")))) from None
    except (urllib.error.URLError, OSError) as error:
        raise _unreachable(error) from None
