"""Reading catalog files: YAML parsing, schema validation, layering."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from opod import config
from opod.contract import env as contract_env
from opod.contract.catalog import RESTRICTED_TAG, Entry
from opod.contract.wire import WireError


class CatalogError(ValueError):
    """A catalog file that cannot be used; the message names the file, the field and the reason."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"{path}: " + "; ".join(problems))


def bundled_dir() -> Path:
    return Path(__file__).parent / "models"


def load_entry(path: Path) -> Entry:
    """Parse and validate one ``<id>.yaml`` file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CatalogError(path, [f"cannot read: {err.strerror}"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise CatalogError(path, [f"not valid YAML: {where}{getattr(err, 'problem', None) or err}"]) from None
    if not isinstance(data, dict):
        raise CatalogError(path, ["expected a mapping of catalog keys (id, display_name, source, ...)"])
    try:
        entry = Entry.from_wire(data)
    except WireError as err:
        raise CatalogError(path, err.problems) from None
    problems = []
    if path.stem != entry.id:
        problems.append(f"id: {entry.id!r} must equal the file name without .yaml ({path.stem!r})")
    if not entry.license:
        problems.append("license: required (an SPDX id such as apache-2.0)")
    elif entry.restricted and RESTRICTED_TAG not in entry.tags:
        problems.append(
            f"tags: licence {entry.license!r} is not permissive, so the tags must include {RESTRICTED_TAG!r}"
        )
    if problems:
        raise CatalogError(path, problems)
    return entry


@dataclass
class Catalog:
    entries: dict[str, Entry] = field(default_factory=dict)
    origins: dict[str, Path] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Files that were skipped, and why; shown to the operator, never silently dropped."""

    def get(self, model_id: str) -> Entry | None:
        return self.entries.get(model_id)

    def ids(self) -> list[str]:
        return sorted(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries[i] for i in self.ids())


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def _layers(environ: Mapping[str, str] | None) -> list[Path]:
    layers = [bundled_dir()]
    override = config.read(contract_env.ENV_CATALOG_DIR, environ)
    if override:
        layers.append(Path(override).expanduser())
    layers.append(config.home(environ) / "catalog")
    return layers


def load_catalog(directories: Iterable[Path] | None = None, environ: Mapping[str, str] | None = None) -> Catalog:
    """Load every layer; a bad file in an override directory is skipped and reported, not fatal."""
    catalog = Catalog()
    bundled = bundled_dir()
    signed = config.read(contract_env.ENV_CATALOG_PUBKEY, environ) or config.flag(
        contract_env.ENV_CATALOG_REQUIRE_SIGNED, environ
    )
    for directory in list(directories) if directories is not None else _layers(environ):
        if not directory.is_dir():
            continue
        if directory != bundled and signed:
            catalog.problems.append(
                f"{directory}: skipped: {contract_env.ENV_CATALOG_PUBKEY}/{contract_env.ENV_CATALOG_REQUIRE_SIGNED} "
                "ask for signed catalog files, and this build cannot verify minisign signatures; unset them to load it"
            )
            continue
        for path in _files(directory):
            try:
                entry = load_entry(path)
            except CatalogError as err:
                if directory == bundled:
                    raise
                catalog.problems.append(str(err))
                continue
            catalog.entries[entry.id] = entry
            catalog.origins[entry.id] = path
    return catalog
