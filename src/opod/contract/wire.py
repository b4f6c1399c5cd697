"""The base of every wire type: Go's JSON rules expressed on pydantic models.

A field declares its JSON key as its alias, and its omission rule with a marker
in ``Annotated``:

- no marker: the key is always written (``None`` is written as ``null``);
- :data:`OMITEMPTY`: Go's ``omitempty`` on a value: dropped when ``False``,
  ``0``, ``""``, ``None`` or an empty list or map, never for a nested object;
- :data:`OMITNIL`: ``omitempty`` on a pointer: dropped only when ``None``
  ("not said"); a pointer to an empty list or ``false`` is written;
- :data:`OMITZERO`: Go's ``omitzero``: a nested object is dropped when every
  field in it is zero.

Decoding follows Go's receiver: unknown keys are ignored, a key matches its
field case-insensitively when no exact match exists, ``null`` for a field that
cannot hold it leaves the zero value, and a wrong JSON type is a
:class:`WireError` naming the field.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from opod.contract import gojson

__all__ = [
    "OMITEMPTY",
    "OMITNIL",
    "OMITZERO",
    "GoTime",
    "Nanoseconds",
    "SECOND",
    "WireError",
    "WireModel",
    "ZERO_TIME",
    "decode_list",
    "encode_list",
    "format_time",
    "parse_time",
]


class _Omit:
    def __init__(self, rule: str) -> None:
        self.rule = rule

    def __repr__(self) -> str:
        return f"omit:{self.rule}"


OMITEMPTY = _Omit("empty")
OMITNIL = _Omit("nil")
OMITZERO = _Omit("zero")

# Go's time.Duration travels as an integer count of nanoseconds.
Nanoseconds = int
SECOND: Nanoseconds = 1_000_000_000

ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)
"""Go's zero ``time.Time``."""


class WireError(ValueError):
    """A body that does not fit its wire type; the message names the field and the reason."""

    def __init__(self, type_name: str, problems: list[str]) -> None:
        self.type_name = type_name
        self.problems = problems
        super().__init__(f"{type_name}: " + "; ".join(problems))


def parse_time(value: Any) -> datetime:
    """Parse an RFC 3339 time as Go does; the result is always timezone-aware."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a time needs a timezone (RFC 3339, e.g. 2026-09-18T12:00:00Z)")
        return value
    if not isinstance(value, str):
        raise ValueError("expected an RFC 3339 time string, e.g. 2026-09-18T12:00:00Z")
    text = value.strip()
    if "T" not in text or not (text.endswith(("Z", "z")) or "+" in text[10:] or "-" in text[10:]):
        raise ValueError(f"{value!r} is not an RFC 3339 time (e.g. 2026-09-18T12:00:00Z)")
    head, dot, rest = text.partition(".")
    if dot:
        # Python keeps microseconds; Go may send up to nine fraction digits.
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise ValueError(f"{value!r} is not an RFC 3339 time (e.g. 2026-09-18T12:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no timezone; RFC 3339 needs Z or an offset")
    return parsed


def format_time(value: datetime) -> str:
    """RFC 3339 with the fraction's trailing zeros dropped and UTC written as ``Z``."""
    if value.tzinfo is None:
        raise ValueError("cannot write a naive datetime on the wire; give it a timezone")
    offset = value.utcoffset() or timedelta(0)
    base = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.year < 1000:
        base = f"{value.year:04d}" + base[base.index("-") :]
    fraction = f".{value.microsecond:06d}".rstrip("0") if value.microsecond else ""
    if offset == timedelta(0):
        zone = "Z"
    else:
        total = int(offset.total_seconds())
        sign = "+" if total >= 0 else "-"
        hours, minutes = divmod(abs(total) // 60, 60)
        zone = f"{sign}{hours:02d}:{minutes:02d}"
    return base + fraction + zone


GoTime = Annotated[
    datetime,
    BeforeValidator(parse_time),
    PlainSerializer(format_time, return_type=str),
]
"""A Go ``time.Time`` field; its zero value is ``0001-01-01T00:00:00Z``."""


def _is_empty(value: Any) -> bool:
    if value is None or value is False:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, (str, list, tuple, dict)):
        return len(value) == 0
    return False


def _is_zero(value: Any) -> bool:
    if isinstance(value, dict):
        return all(_is_zero(v) for v in value.values())
    return _is_empty(value)


class WireModel(BaseModel):
    """A JSON body of the opod wire. Subclasses list fields in wire order."""

    model_config = ConfigDict(
        strict=True,
        extra="ignore",
        serialize_by_alias=True,
        validate_by_alias=True,
        validate_by_name=True,
        arbitrary_types_allowed=False,
    )

    # Filled per subclass: JSON key -> omission rule, key -> field name,
    # lower-cased key -> key, keys whose field cannot hold null.
    _wire_omit: ClassVar[dict[str, str]]
    _wire_keys: ClassVar[dict[str, str]]
    _wire_folded: ClassVar[dict[str, str]]
    _wire_not_null: ClassVar[frozenset[str]]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        omit: dict[str, str] = {}
        keys: dict[str, str] = {}
        not_null: set[str] = set()
        for name, info in cls.model_fields.items():
            key = info.alias or name
            keys[key] = name
            annotation = info.annotation
            for meta in info.metadata:
                if isinstance(meta, _Omit):
                    omit[key] = meta.rule
            if omit.get(key) == "empty" and isinstance(annotation, type) and issubclass(annotation, BaseModel):
                del omit[key]  # Go's omitempty never drops a struct value
            nullable = annotation is None or _admits_none(annotation)
            if not nullable:
                not_null.add(key)
        cls._wire_omit = omit
        cls._wire_keys = keys
        cls._wire_folded = {k.lower(): k for k in keys}
        cls._wire_not_null = frozenset(not_null)

    @model_validator(mode="before")
    @classmethod
    def _go_receiver(cls, data: Any) -> Any:
        if isinstance(data, BaseModel):
            return data
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {_json_type(data)}")
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key in cls._wire_keys:
                target = key
            elif key in cls.model_fields:
                target = cls.model_fields[key].alias or key
            else:
                target = cls._wire_folded.get(str(key).lower())
                if target is None or target in data:
                    continue  # unknown keys are ignored, as a Go receiver does
            if value is None and target in cls._wire_not_null:
                continue  # null leaves the zero value
            out[target] = value
        return out

    @model_serializer(mode="wrap")
    def _go_sender(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        omit = self._wire_omit
        if not omit:
            return data
        out: dict[str, Any] = {}
        for key, value in data.items():
            rule = omit.get(key)
            if rule == "nil" and value is None:
                continue
            if rule == "empty" and _is_empty(value):
                continue
            if rule == "zero" and _is_zero(value):
                continue
            out[key] = value
        return out

    # The public encoding API: every sender goes through these.

    def to_wire(self) -> dict[str, Any]:
        """The body as plain JSON data, keys in wire order, omission rules applied."""
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        """Compact JSON, byte-compatible with Go's ``json.Marshal``."""
        return gojson.dumps(self.to_wire())

    def to_canonical(self) -> str:
        """The golden-file form: sorted keys, 2-space indent, final newline."""
        return gojson.canonical(self.to_wire())

    @classmethod
    def from_wire(cls, data: Any) -> Self:
        """Decode a body (bytes, text or parsed JSON); a misfit raises :class:`WireError`."""
        if isinstance(data, (bytes, bytearray, str)):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as err:
                raise WireError(
                    cls.__name__, [f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"]
                ) from None
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise WireError(cls.__name__, _describe(err)) from None


def _admits_none(annotation: Any) -> bool:
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _admits_none(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(arg is type(None) for arg in typing.get_args(annotation))
    return annotation is Any


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


_REASONS = {
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "list_type": "expected an array",
    "dict_type": "expected an object",
    "model_type": "expected an object",
    "int_from_float": "expected an integer",
    "missing": "required",
    "literal_error": "not one of the allowed words",
    "enum": "not one of the allowed words",
}


def _describe(err: ValidationError) -> list[str]:
    problems = []
    for item in err.errors(include_url=False):
        path = ".".join(str(p) for p in item["loc"] if not str(p).startswith("function-"))
        kind = item["type"]
        reason = _REASONS.get(kind)
        if kind in ("literal_error", "enum"):
            expected = item.get("ctx", {}).get("expected", "")
            reason = f"{item.get('input')!r} is not one of {expected}"
        elif kind == "value_error":
            reason = str(item.get("ctx", {}).get("error", item["msg"]))
        elif reason is None:
            reason = item["msg"]
        elif "input" in item and kind != "missing":
            reason = f"{reason}, got {_json_type(item['input'])}"
        problems.append(f"{path}: {reason}" if path else reason)
    return problems


def encode_list(items: list[WireModel] | None) -> list[dict[str, Any]] | None:
    """A top-level JSON array of wire objects (``None`` stays ``null``)."""
    return None if items is None else [item.to_wire() for item in items]


def decode_list(model: type[WireModel], data: Any) -> list[Any] | None:
    """Decode a top-level JSON array of ``model`` objects."""
    if isinstance(data, (bytes, bytearray, str)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise WireError(f"[]{model.__name__}", [f"not valid JSON: {err.msg}"]) from None
    if data is None:
        return None
    if not isinstance(data, list):
        raise WireError(f"[]{model.__name__}", [f"expected an array, got {_json_type(data)}"])
    out = []
    for i, item in enumerate(data):
        try:
            out.append(model.model_validate(item))
        except ValidationError as err:
            raise WireError(f"[]{model.__name__}", [f"[{i}].{p}" for p in _describe(err)]) from None
    return out
