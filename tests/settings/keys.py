"""Every key of the settings schema as docs/settings.md writes it: ``budgets[].period``, ``prices.<key>.input_per_million``."""

from __future__ import annotations

import typing
from collections.abc import Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def _models(annotation: object) -> Iterator[tuple[str, type[BaseModel]]]:
    """The nested models inside an annotation, with the suffix its container adds to the key."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "", annotation
    elif origin is dict:
        for suffix, model in _models(args[1]):
            yield ".<key>" + suffix, model
    elif origin is list:
        for suffix, model in _models(args[0]):
            yield "[]" + suffix, model
    else:
        for arg in args:
            yield from _models(arg)


def keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        yield key, info
        for suffix, inner in _models(info.annotation):
            yield from keys(inner, f"{key}{suffix}.")
