"""What the registry has for a model against what it runs: its origin's files compared with the repository's latest.

A model's origin (``catalog.Origin``) names the repository, the commit its weights were fetched
at and each file with the sha256 the registry published. The latest commit changes a model only
when one of those files differs there (a README edited is no update); a file the latest commit
no longer has is ``missing``, and such a model cannot be moved. The origin recorded by hand for
weights added from a file (``POST /models/{name}/origin``) is found here too: the repository's
file with the same digest, or else the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath

from opod.contract.admin.catalog import CatalogOrigin, CatalogOriginFile, CatalogPreviousOrigin
from opod.contract.admin.models import ModelserveUpdateInfo
from opod.weights.choose import HubFile
from opod.weights.files import sha256_file
from opod.weights.hub import HubClient, HubSettings
from opod.weights.registry import Artifact


@dataclass(frozen=True, slots=True)
class Latest:
    """A repository's head as the registry lists it: its commit and its files by path."""

    repo: str
    revision: str
    files: dict[str, HubFile]


async def read_latest(hub: HubSettings, repo: str) -> Latest:
    """The repository's latest commit and files; raises the Hub client's errors (``WeightsError``)."""
    async with HubClient(hub) as client:
        info = await client.model_info(repo)
        files = await client.list_files(repo, info.sha)
    return Latest(repo, info.sha, {f.path: f for f in files})


def _differs(mine: CatalogOriginFile, theirs: HubFile) -> bool:
    if mine.sha256 and theirs.sha256:
        return mine.sha256 != theirs.sha256
    return mine.bytes is not None and mine.bytes != theirs.size


def compare(model: str, origin: CatalogOrigin, latest: Latest, at: datetime) -> ModelserveUpdateInfo:
    """The model's files against the repository's latest commit."""
    changed: list[str] = []
    missing: list[str] = []
    size = 0
    for mine in origin.files or []:
        path = mine.path or ""
        theirs = latest.files.get(path)
        if theirs is None:
            missing.append(path)
        elif _differs(mine, theirs):
            changed.append(path)
            size += theirs.size
    error = (
        f"the latest commit {latest.revision[:12]} no longer has {', '.join(missing)}; serve another file of "
        f"{latest.repo} (POST /api/v1/models/serve) to move to it"
        if missing
        else None
    )
    return ModelserveUpdateInfo(
        model=model,
        repo=origin.repo,
        current=origin.revision or None,
        latest=latest.revision,
        changed=changed or None,
        missing=missing or None,
        bytes=size,
        available=bool(changed) and not missing,
        previous=origin.previous.revision if origin.previous is not None and origin.previous.revision else None,
        checked_at=at,
        error=error,
    )


def unchecked(model: str, origin: CatalogOrigin, at: datetime, error: str) -> ModelserveUpdateInfo:
    """A model the registry could not be asked about, and why."""
    return ModelserveUpdateInfo(
        model=model,
        repo=origin.repo,
        current=origin.revision or None,
        available=False,
        previous=origin.previous.revision if origin.previous is not None and origin.previous.revision else None,
        checked_at=at,
        error=error,
    )


def moved(origin: CatalogOrigin, source: str, latest: Latest) -> tuple[str, CatalogOrigin, Artifact]:
    """The source, origin and files of the model at ``latest``: what an update moves it to, the old kept as previous."""
    files = [latest.files[f.path or ""] for f in origin.files or []]
    new_origin = CatalogOrigin(
        repo=latest.repo,
        revision=latest.revision,
        files=[CatalogOriginFile(path=f.path, sha256=f.sha256, bytes=f.size) for f in files],
        previous=CatalogPreviousOrigin(source=source, revision=origin.revision, files=origin.files),
    )
    return _hub_source(latest.repo, files[0].path), new_origin, _artifact(files)


def back(origin: CatalogOrigin, source: str) -> tuple[str, CatalogOrigin, Artifact]:
    """The source, origin and files of what the last update replaced: what a rollback returns to, the current kept as
    previous (so a rollback can itself be undone)."""
    previous = origin.previous or CatalogPreviousOrigin()
    files = [HubFile(path=f.path or "", size=f.bytes or 0, sha256=f.sha256) for f in previous.files or []]
    new_origin = CatalogOrigin(
        repo=origin.repo,
        revision=previous.revision,
        files=previous.files,
        previous=CatalogPreviousOrigin(source=source, revision=origin.revision, files=origin.files),
    )
    return previous.source or _hub_source(origin.repo or "", files[0].path), new_origin, _artifact(files)


def _hub_source(repo: str, first: str) -> str:
    return f"{repo}/{first}" if first.endswith(".gguf") else repo


def _artifact(files: list[HubFile]) -> Artifact:
    first = files[0].path
    format = "gguf" if first.endswith(".gguf") else "safetensors"
    return Artifact(name=PurePosixPath(first).name, format=format, files=tuple(files), quant="", bits_per_weight=0.0)


def found_origin(repo: str, source: str, latest: Latest) -> CatalogOrigin:
    """The origin of weights added by hand: the repository's file with the local file's digest (that commit is the
    one running), else its file of the same name (the commit running is not known, so any digest differs), else
    ``ValueError`` saying what the repository has."""
    local = Path(source).expanduser()
    name = PurePosixPath(source).name
    digest = sha256_file(local) if source.startswith(("/", "./", "~")) and local.is_file() else ""
    if digest:
        same = next((f for f in latest.files.values() if f.sha256 == digest), None)
        if same is not None:
            mine = CatalogOriginFile(path=same.path, sha256=same.sha256, bytes=same.size)
            return CatalogOrigin(repo=repo, revision=latest.revision, files=[mine])
    named = next((f for f in latest.files.values() if PurePosixPath(f.path).name == name), None)
    if named is None:
        weights = sorted(p for p in latest.files if p.endswith((".gguf", ".safetensors")))
        raise ValueError(
            f"repo: {repo} has no file {name!r} at its latest commit {latest.revision[:12]}"
            + (f"; it has {', '.join(weights[:8])}" if weights else "; it has no weights files")
        )
    if digest or not source.startswith(repo + "/"):
        mine = CatalogOriginFile(path=named.path, sha256=digest or None, bytes=local.stat().st_size if digest else None)
        return CatalogOrigin(repo=repo, files=[mine])
    mine = CatalogOriginFile(path=named.path, sha256=named.sha256, bytes=named.size)
    return CatalogOrigin(repo=repo, revision=latest.revision, files=[mine])
