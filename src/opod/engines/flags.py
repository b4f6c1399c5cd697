"""Checking a launch spec and reading plan flags, with errors that name the field.

Plan flags arrive as JSON (``OPOD_ENGINE_FLAGS``), written by a person or a
manager, so every read checks the type and says what was expected. ``extra``
goes straight into the engine's argv: it must be plain flag/value strings.
No shell ever sees them, but shell syntax in one means the author expected a
shell, so it is refused rather than passed on as a literal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from opod.engines.base import LaunchSpec
from opod.engines.errors import LaunchError

_FLAG = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_.\-]*(=.*)?$")
_SHELL = ("`", "$(", "${", ";", "|", "&", "<", ">")
_MAX_ITEM = 4096


def _plain(field: str, text: str) -> None:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise LaunchError(field, f"{text!r} holds a control character (newline, tab, NUL…)", "write it on one line")
    if len(text) > _MAX_ITEM:
        raise LaunchError(field, f"is {len(text)} characters long (at most {_MAX_ITEM})", "shorten it")


def check_spec(spec: LaunchSpec, *, needs_port: bool = True) -> None:
    """Refuse a spec no engine could be started from."""
    for name in ("model_id", "model"):
        value = getattr(spec, name)
        if not isinstance(value, str) or not value.strip():
            raise LaunchError(f"spec.{name}", "is empty", "name the model to serve")
        _plain(f"spec.{name}", value)
        if value.startswith("-"):
            raise LaunchError(f"spec.{name}", f"{value!r} starts with '-' and would read as a flag", "rename it")
    if any(c.isspace() for c in spec.model_id):
        raise LaunchError("spec.model_id", f"{spec.model_id!r} contains whitespace", "use a catalog id without spaces")
    _plain("spec.host", spec.host)
    if not spec.host or any(c.isspace() for c in spec.host) or spec.host.startswith("-"):
        raise LaunchError("spec.host", f"{spec.host!r} is not a host name or address", "use e.g. 127.0.0.1")
    if needs_port and not (isinstance(spec.port, int) and 0 < spec.port < 65536):
        raise LaunchError(
            "spec.port", f"{spec.port!r} is not a port (1–65535)", "the supervisor picks a free loopback port"
        )
    for name in ("context", "parallel", "threads"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LaunchError(f"spec.{name}", f"{value!r} is not a whole number ≥ 0", "use 0 for the engine's default")
    for i, item in enumerate(spec.launcher):
        if not isinstance(item, str) or not item:
            raise LaunchError(
                f"spec.launcher[{i}]", f"{item!r} is not a non-empty string", "give the command as a list of strings"
            )


def int_flag(flags: Mapping[str, object], key: str, *, minimum: int = 0) -> int | None:
    """An integer plan flag; ``None`` when absent."""
    value = flags.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LaunchError(
            f"flags.{key}", f"{value!r} is not a whole number ≥ {minimum}", f"set {key} to a number, or remove it"
        )
    return value


def float_flag(
    flags: Mapping[str, object], key: str, *, low: float, high: float, low_inclusive: bool = False
) -> float | None:
    value = flags.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not ((value >= low if low_inclusive else value > low) and value <= high)
    ):
        bracket = "[" if low_inclusive else "("
        raise LaunchError(
            f"flags.{key}",
            f"{value!r} is not a number in {bracket}{low:g}, {high:g}]",
            f"set {key} within that range, or remove it",
        )
    return float(value)


def bool_flag(flags: Mapping[str, object], key: str) -> bool | None:
    value = flags.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise LaunchError(f"flags.{key}", f"{value!r} is not true or false", f"set {key} to a JSON boolean")
    return value


def str_flag(flags: Mapping[str, object], key: str, *, choices: tuple[str, ...] = ()) -> str | None:
    value = flags.get(key)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise LaunchError(f"flags.{key}", f"{value!r} is not a non-empty string", f"set {key} to a word, or remove it")
    _plain(f"flags.{key}", value)
    if value.startswith("-"):
        raise LaunchError(f"flags.{key}", f"{value!r} starts with '-' and would read as a flag", "give only the value")
    if choices and value not in choices:
        raise LaunchError(f"flags.{key}", f"{value!r} is not one of {', '.join(choices)}", "pick one of those")
    return value


def list_flag(flags: Mapping[str, object], key: str) -> list[str] | None:
    """A list of words, given as a JSON list or one comma-separated string."""
    value = flags.get(key)
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise LaunchError(
            f"flags.{key}", f"{value!r} is not a list", f"give {key} as a JSON list or a comma-separated string"
        )
    out = []
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise LaunchError(f"flags.{key}[{i}]", f"{item!r} is not a word or number", "use plain values")
        text = str(item).strip()
        _plain(f"flags.{key}[{i}]", text)
        if not text or "," in text or text.startswith("-"):
            raise LaunchError(
                f"flags.{key}[{i}]", f"{item!r} is empty, holds a comma or starts with '-'", "use plain values"
            )
        out.append(text)
    return out


def _flag_name(item: str) -> str:
    return item.split("=", 1)[0]


def extra_args(flags: Mapping[str, object], reserved: frozenset[str] = frozenset()) -> list[str]:
    """The plan's ``extra`` list, checked item by item.

    ``reserved`` names flags the driver sets itself (host, port, model, served
    name): overriding them would make the worker probe a port the engine does
    not listen on, or route a name the engine does not serve.
    """
    value = flags.get("extra")
    if value is None:
        return []
    if not isinstance(value, list):
        raise LaunchError(
            "flags.extra",
            f"is a {type(value).__name__}, not a list",
            'give it as a JSON list, e.g. ["--flag", "value"]',
        )
    out: list[str] = []
    for i, item in enumerate(value):
        field = f"flags.extra[{i}]"
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise LaunchError(field, f"{item!r} is not a string or number", "extra takes plain flag/value strings")
        text = str(item)
        _plain(field, text)
        if not text:
            raise LaunchError(field, "is empty", "remove it")
        bad = next((s for s in _SHELL if s in text), None)
        if bad is not None:
            raise LaunchError(
                field,
                f"{text!r} contains shell syntax {bad!r}",
                "extra items go to the engine as separate argv items, never through a shell; give plain flag/value strings",
            )
        if text.startswith("-") and not _is_number(text):
            if not _FLAG.match(text):
                raise LaunchError(field, f"{text!r} is not a flag (--name or --name=value)", "fix the flag's spelling")
            if _flag_name(text) in reserved:
                raise LaunchError(
                    field,
                    f"{_flag_name(text)} is set by opod itself",
                    "remove it; opod sets the address and model names",
                )
        elif i == 0:
            raise LaunchError(
                field, f"{text!r} is a value with no flag before it", "start extra with a flag such as --name"
            )
        out.append(text)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
