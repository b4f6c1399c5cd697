"""Tool calling in the simulator: which tools a request calls, and with what arguments.

The choice is deterministic, so a test knows the answer before it asks:

- no ``tools``, ``tool_choice: "none"``, or a turn that follows a ``tool`` message
  (unless a call is forced): a text answer;
- ``tool_choice`` naming a function: that function;
- ``parallel_tool_calls: true`` (sent explicitly) with ``auto`` or ``required``: every tool, in order;
- otherwise: the first tool.

Arguments fill the function's JSON schema: every required property gets a value
of its type (its ``default``, else its first ``enum`` value, else a fixed value per
type), so a client that validates against the schema accepts them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from opod.sim.errors import bad_request

__all__ = ["PlannedCall", "plan_tool_calls", "arguments_for", "tools_prompt"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CHOICES = ("none", "auto", "required")
_MAX_DEPTH = 8


@dataclass(frozen=True, slots=True)
class PlannedCall:
    name: str
    arguments: str
    """The arguments as the JSON text the answer carries."""


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("tools", '`tools` must be a list of {"type": "function", "function": {...}} objects')
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise bad_request(
                f"tools[{i}]",
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}',
            )
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(
                f"tools[{i}].function.name",
                f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-' (got {name!r})",
            )
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(
                f"tools[{i}].function.parameters", f"tools[{i}].function.parameters must be a JSON schema object"
            )
    return tools


def _forced_name(choice: Any, names: list[str]) -> str | None:
    """The function ``tool_choice`` names; ``None`` for ``none``, ``auto`` and ``required``."""
    if choice is None or choice in _CHOICES:
        return None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise bad_request(
            "tool_choice",
            '`tool_choice` must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
        )
    if name not in names:
        raise bad_request("tool_choice", f"tool_choice names {name!r}, which is not in `tools` ({', '.join(names)})")
    return name


def plan_tool_calls(body: dict[str, Any]) -> list[PlannedCall]:
    """The calls the answer makes; empty for a text answer. A malformed ``tools`` or ``tool_choice`` is a 400."""
    tools = _tools(body)
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice", "`tool_choice` is only allowed when `tools` are given")
        return []
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls", f"`parallel_tool_calls` must be true or false (got {parallel!r})")
    names = [t["function"]["name"] for t in tools]
    forced = _forced_name(choice, names)
    if choice == "none":
        return []
    messages = body.get("messages")
    after_tool = (
        isinstance(messages, list)
        and bool(messages)
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "tool"
    )
    if after_tool and forced is None and choice != "required":
        return []
    if forced is not None:
        chosen = [tools[names.index(forced)]]
    elif parallel is True:
        chosen = tools
    else:
        chosen = tools[:1]
    return [
        PlannedCall(
            t["function"]["name"], json.dumps(arguments_for(t["function"].get("parameters") or {}), ensure_ascii=False)
        )
        for t in chosen
    ]


def arguments_for(schema: dict[str, Any], depth: int = 0) -> Any:
    """A value that fits ``schema``: for an object, its required properties filled in."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    if "default" in schema:
        return schema["default"]
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and isinstance(options[0], dict):
            return arguments_for(options[0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        return {name: arguments_for(props.get(name) or {}, depth + 1) for name in required if isinstance(name, str)}
    if kind == "array":
        least = schema.get("minItems")
        item = schema.get("items")
        item = item if isinstance(item, dict) else {}
        return [
            arguments_for(item, depth + 1) for _ in range(least if isinstance(least, int) and 0 < least <= 8 else 0)
        ]
    if kind == "integer":
        return _bounded(schema, 1)
    if kind == "number":
        return float(_bounded(schema, 1))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return "sim"


def _bounded(schema: dict[str, Any], value: int) -> int:
    low = schema.get("minimum")
    high = schema.get("maximum")
    if isinstance(low, int | float) and value < low:
        value = int(low) if float(low).is_integer() else int(low) + 1
    if isinstance(high, int | float) and value > high:
        value = int(high)
    return value


def tools_prompt(body: dict[str, Any]) -> dict[str, str] | None:
    """The tools as the system message an engine's template puts ahead of the conversation; ``None`` without tools."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    return {"role": "system", "content": "Tools: " + json.dumps(tools, ensure_ascii=False, separators=(",", ":"))}
