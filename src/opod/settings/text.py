"""The settings body as text: YAML read, validated against ClusterSettings, refused whole with the line and the field.

A problem reads ``line 7: budgets[0].period: must be day, week or month``: the line of the YAML
body (1-based) where the offending value, or the unknown key, stands.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from opod.settings.schema import ClusterSettings

MAX_PROBLEMS = 10

ScopeCheck = Callable[[str, tuple[str, ...], str], object]
"""``check(text, kinds, field)`` raises ValueError naming ``field`` when ``text`` is not a scope of ``kinds``
(``opod.access.scopes.parse_scope`` is one; this package sits below ``access`` and is handed it)."""
ANY_SCOPE = ("org", "team", "project", "user", "key")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Problem:
    line: int  # 1-based; 0 when the body has no line to point at
    field: str  # "budgets[0].period"; "" for the body as a whole
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.field}: {self.message}" if self.field else f"{where}{self.message}"


class SettingsInvalid(ValueError):
    """The body is not valid settings; ``problems`` lists each, the message names the first ones."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        shown = "; ".join(str(p) for p in problems[:MAX_PROBLEMS])
        more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
        super().__init__(f"the settings body is refused: {shown}{more}")


def field_path(loc: tuple[int | str, ...]) -> str:
    """``("budgets", 0, "period")`` → ``budgets[0].period``; a key that is no identifier is quoted."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _child(node: yaml.Node, part: int | str) -> tuple[yaml.Node, yaml.Node | None] | None:
    """The node at ``part`` under ``node`` and, in a mapping, its key's node."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return value, key
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return node.value[part], None
    return None


def _line(root: yaml.Node | None, loc: tuple[int | str, ...], *, at_key: bool) -> int:
    """The line of the value at ``loc`` (of its key when ``at_key``), or of the nearest node above it."""
    if root is None:
        return 0
    node, key = root, None
    for part in loc:
        found = _child(node, part)
        if found is None:
            break
        node, key = found
    else:
        if at_key and key is not None:
            return key.start_mark.line + 1
    return node.start_mark.line + 1


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "is not a settings key here; docs/settings.md lists every key"
    if kind == "missing":
        return "is required"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        words = [w.strip().strip("'") for w in re.split(r",| or ", str(expected)) if w.strip()]
        return "must be " + (", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words))
    message = error["msg"]
    message = message.removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def _duplicates(node: yaml.Node, path: tuple[int | str, ...] = ()) -> list[Problem]:
    """Keys given twice in one mapping: YAML readers keep the last silently, which hides a mistake."""
    problems: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            if name in seen:
                problems.append(Problem(key.start_mark.line + 1, field_path((*path, name)), "is given twice; keep one"))
            seen.add(name)
            problems += _duplicates(value, (*path, name))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            problems += _duplicates(item, (*path, index))
    return problems


def _scope_problems(settings: ClusterSettings, root: yaml.Node | None, check: ScopeCheck) -> list[Problem]:
    """Every scope the body names, read by ``check``: a budget's scope, the keys of keys.scopes and retention.projects,
    the places auth.oidc.group_memberships names, and the targets of auth.ldap.memberships."""
    places: list[tuple[tuple[int | str, ...], str, tuple[str, ...], bool]] = [
        (("budgets", i, "scope"), budget.scope, ANY_SCOPE, False) for i, budget in enumerate(settings.budgets)
    ]
    places += [
        (("keys", "scopes", text), text, ("org", "team", "project", "user"), True) for text in settings.keys.scopes
    ]
    places += [(("retention", "projects", text), text, ("project",), True) for text in settings.retention.projects]
    places += [
        (("auth", "oidc", "group_memberships", group, i, "target"), place.target, ("org", "team", "project"), False)
        for group, held in settings.auth.oidc.group_memberships.items()
        for i, place in enumerate(held)
    ]
    places += [
        (("auth", "ldap", "memberships", i, "target"), grant.target, ("org", "team", "project"), False)
        for i, grant in enumerate(settings.auth.ldap.memberships)
    ]
    problems = []
    for loc, text, kinds, at_key in places:
        try:
            check(text, kinds, field_path(loc))
        except ValueError as err:
            problems.append(Problem(_line(root, loc, at_key=at_key), "", str(err)))
    return problems


def parse_settings(body: str, *, check_scope: ScopeCheck | None = None) -> ClusterSettings:
    """Read and validate a settings body; raise SettingsInvalid naming the line and the field of every problem.

    With ``check_scope``, every scope text in the body is read by it too (syntax: whether it names
    something is decided when it is used, so a rollback to a body naming a removed project still works).
    """
    try:
        root = yaml.compose(body, Loader=yaml.SafeLoader)
        data: Any = yaml.safe_load(body)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else 0
        raise SettingsInvalid([Problem(line, "", f"not valid YAML: {err.problem or err.context}")]) from err
    except yaml.YAMLError as err:
        raise SettingsInvalid([Problem(0, "", f"not valid YAML: {err}")]) from err
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsInvalid(
            [Problem(1, "", f"the body must be a mapping of settings keys, not {type(data).__name__}")]
        )
    duplicates = _duplicates(root) if root is not None else []
    if duplicates:
        raise SettingsInvalid(duplicates)
    try:
        settings = ClusterSettings.model_validate(data)
    except ValidationError as err:
        problems = [
            Problem(
                _line(root, error["loc"], at_key=error["type"] in ("extra_forbidden", "missing")),
                field_path(error["loc"]),
                _message(error),
            )
            for error in err.errors(include_url=False)
        ]
        raise SettingsInvalid(sorted(problems, key=lambda p: p.line)) from err
    if check_scope is not None and (problems := _scope_problems(settings, root, check_scope)):
        raise SettingsInvalid(sorted(problems, key=lambda p: p.line))
    return settings


def check_settings(body: str, *, check_scope: ScopeCheck | None = None) -> None:
    """Raise SettingsInvalid when ``body`` would be refused; nothing else."""
    parse_settings(body, check_scope=check_scope)
