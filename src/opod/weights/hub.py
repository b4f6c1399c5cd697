"""A client for the Hugging Face Hub's file API: list a repository, choose a GGUF, download a file.

The contract variables apply, read through :func:`opod.config.read`:
``HF_ENDPOINT`` (a mirror), ``HF_TOKEN`` (gated and private repositories),
``OPOD_MODEL_REVISION`` (the revision when a call names none; ``main``
otherwise) and ``OPOD_MODEL_SHA256`` (the expected digest of the model file,
applied by :meth:`HubClient.fetch_model`).

Files are cached at ``dest_dir/<owner>--<repo>@<revision>/<path>``, so two
revisions of a repository coexist. A cached file is used without asking the
hub, which keeps a worker serving when the hub is away; pin a commit to be sure
what ``main`` meant.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
from collections.abc import Awaitable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
from multidict import CIMultiDict

from opod import __version__, config
from opod.contract import env as contract_env
from opod.weights.choose import GGUFChoice, HubFile, choose_gguf
from opod.weights.errors import DigestMismatchError, WeightsError
from opod.weights.files import (
    Progress,
    async_file_lock,
    is_sha256,
    known_digest,
    normalize_sha256,
    record_digest,
    remove_with_record,
)
from opod.weights.transfer import HTTPRefusal, fetch_resumable, open_following

__all__ = [
    "DEFAULT_ENDPOINT",
    "GGUFChoice",
    "HubClient",
    "HubError",
    "HubFile",
    "HubSettings",
    "ModelInfo",
    "cache_path",
    "choose_gguf",
    "download",
    "download_sync",
    "fetch_model",
    "fetch_model_sync",
    "list_files",
    "list_files_sync",
    "model_info",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
_REPO = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")
_GIT_OID = re.compile(r"^[0-9a-f]{40}$")
_T = TypeVar("_T")


class HubError(WeightsError):
    """The hub refused a request; ``status`` and ``code`` (its ``X-Error-Code``) say how."""

    def __init__(self, message: str, status: int, code: str = "") -> None:
        self.status = status
        self.code = code
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class HubSettings:
    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    revision: str = DEFAULT_REVISION
    sha256: str | None = None
    """``OPOD_MODEL_SHA256``: the pinned digest of the model file."""

    @classmethod
    def from_config(cls, environ: Mapping[str, str] | None = None) -> HubSettings:
        endpoint = config.read(contract_env.ENV_HF_ENDPOINT, environ) or DEFAULT_ENDPOINT
        if not endpoint.startswith(("http://", "https://")):
            raise WeightsError(
                f"{contract_env.ENV_HF_ENDPOINT}: {endpoint!r} is not an http(s) URL; set it to the hub or mirror's base URL"
            )
        pinned = config.read(contract_env.ENV_MODEL_SHA256, environ)
        try:
            sha256 = normalize_sha256(pinned, contract_env.ENV_MODEL_SHA256)
        except ValueError as err:
            raise WeightsError(f"{err}; correct or unset it") from None
        return cls(
            endpoint=endpoint.rstrip("/"),
            token=config.read(contract_env.ENV_HF_TOKEN, environ),
            revision=config.read(contract_env.ENV_MODEL_REVISION, environ) or DEFAULT_REVISION,
            sha256=sha256,
        )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str
    sha: str
    """The commit the revision points at."""
    files: tuple[str, ...]
    gated: bool
    private: bool
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def check_repo(repo: str) -> str:
    if not isinstance(repo, str) or not _REPO.match(repo) or ".." in repo:
        raise WeightsError(
            f"repo: {repo!r} is not a hub repository id; expected owner/name, such as HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
        )
    return repo


def _check_filename(filename: str) -> str:
    path = PurePosixPath(filename)
    if not filename or path.is_absolute() or ".." in path.parts or "\\" in filename:
        raise WeightsError(f"file: {filename!r} is not a path inside a repository")
    return str(path)


def cache_path(dest_dir: Path | str, repo: str, revision: str, filename: str) -> Path:
    """``dest_dir/<owner>--<repo>@<revision>/<filename>``; a revision with ``/`` (refs/pr/1) is escaped."""
    folder = f"{check_repo(repo).replace('/', '--')}@{quote(revision, safe='')}"
    return Path(dest_dir) / folder / _check_filename(filename)


def _strip_etag(value: str | None) -> str:
    if not value:
        return ""
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"').lower()


def _git_blob_oid(path: Path) -> str:
    """Git's object id of a file (SHA-1 of ``blob <size>\\0`` + content): how the hub names a non-LFS file."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class HubClient:
    """One session against one hub endpoint; use as ``async with HubClient() as hub:``."""

    def __init__(
        self,
        settings: HubSettings | None = None,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        environ: Mapping[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        attempts: int = 4,
        backoff_s: float = 0.25,
    ) -> None:
        base = settings or HubSettings.from_config(environ)
        self.settings = HubSettings(
            endpoint=(endpoint or base.endpoint).rstrip("/"),
            token=token if token is not None else base.token,
            revision=base.revision,
            sha256=base.sha256,
        )
        self._timeout = timeout or aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
        self._session: aiohttp.ClientSession | None = None
        # A cut connection or a 429/5xx is retried (resuming) this many times, backing off from backoff_s.
        self.attempts = attempts
        self.backoff_s = backoff_s

    async def __aenter__(self) -> HubClient:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers={"User-Agent": f"opod/{__version__}"})
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("HubClient is used outside `async with HubClient() as hub:`")
        return self._session

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.settings.token}"} if self.settings.token else {}

    def _error(self, refusal: HTTPRefusal, repo: str, revision: str, filename: str | None = None) -> HubError:
        code = refusal.headers.get("X-Error-Code", "")
        said = refusal.headers.get("X-Error-Message") or refusal.text.strip()[:300]
        what = f"{repo}@{revision}" + (f": {filename}" if filename else "")
        page = f"{self.settings.endpoint}/{repo}"
        token = contract_env.ENV_HF_TOKEN
        status = refusal.status
        if code == "GatedRepo" or (status == 403 and "gated" in said.lower()):
            if self.settings.token:
                advice = f"the model is gated and the account of {token} has not been granted access: accept its conditions at {page}"
            else:
                advice = (
                    f"the model is gated: accept its conditions at {page}, then set {token} to a token of that account"
                )
        elif status == 401:
            advice = (
                f"{token} was refused: it is invalid or expired; create a new one and set {token}"
                if self.settings.token
                else f"the repository does not exist or is private: check the name, or set {token} to a token with access"
            )
        elif status == 403:
            advice = f"{token} lacks access to {repo}: use a token of an account with access (read scope)"
        elif code == "RepoNotFound":
            advice = f"{repo} was not found on {self.settings.endpoint}: check the repository id (a private one needs {token})"
        elif code == "RevisionNotFound":
            advice = f"revision {revision!r} does not exist in {repo}: check {contract_env.ENV_MODEL_REVISION} (a branch, tag or commit)"
        elif code == "EntryNotFound" or (status == 404 and filename):
            advice = f"{repo} has no file {filename!r} at revision {revision!r}: check the name (source.file) against {page}/tree/{revision}"
        elif status == 404:
            advice = f"{repo} was not found on {self.settings.endpoint}: check the repository id"
        elif status == 429:
            advice = (
                f"the hub is rate-limiting this machine: wait and retry, or set {token} (signed-in limits are higher)"
            )
        else:
            advice = (
                f"the hub answered HTTP {status}: retry later; if it persists, check {contract_env.ENV_HF_ENDPOINT}"
            )
        detail = f" (hub said: {said})" if said else ""
        return HubError(f"{what}: {advice}{detail}", status, code)

    async def _get_json(self, url: str, repo: str, revision: str) -> tuple[Any, aiohttp.ClientResponse]:
        try:
            response, _ = await open_following(self.session, url, self._headers())
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            raise self._unreachable(err) from None
        try:
            if response.status >= 400:
                text = (await response.content.read(4096)).decode(errors="replace")
                raise self._error(HTTPRefusal(response.status, response.headers, text, url), repo, revision)
            try:
                return await response.json(content_type=None), response
            except ValueError:
                raise WeightsError(
                    f"{url}: the hub's answer is not JSON; is {contract_env.ENV_HF_ENDPOINT} a hub?"
                ) from None
        finally:
            response.release()

    def _unreachable(self, err: BaseException) -> WeightsError:
        return WeightsError(
            f"cannot reach the hub at {self.settings.endpoint} ({type(err).__name__}: {err}); check the network, "
            f"or set {contract_env.ENV_HF_ENDPOINT} to a reachable mirror"
        )

    async def model_info(self, repo: str, revision: str | None = None) -> ModelInfo:
        """The repository's id, commit and file names (``GET /api/models/{repo}[/revision/{rev}]``)."""
        check_repo(repo)
        url = f"{self.settings.endpoint}/api/models/{repo}"
        if revision:
            url += f"/revision/{quote(revision, safe='')}"
        data, _ = await self._get_json(url, repo, revision or DEFAULT_REVISION)
        if not isinstance(data, dict):
            raise WeightsError(f"{url}: expected a JSON object")
        siblings = tuple(s.get("rfilename", "") for s in data.get("siblings") or [] if isinstance(s, dict))
        return ModelInfo(
            id=str(data.get("id") or data.get("modelId") or repo),
            sha=str(data.get("sha") or ""),
            files=siblings,
            gated=bool(data.get("gated")),
            private=bool(data.get("private")),
            raw=data,
        )

    async def list_files(self, repo: str, revision: str | None = None) -> list[HubFile]:
        """Every file of the repository at the revision, with sizes and LFS digests (pages followed)."""
        check_repo(repo)
        revision = revision or self.settings.revision
        url: str | None = f"{self.settings.endpoint}/api/models/{repo}/tree/{quote(revision, safe='')}?recursive=true"
        files: list[HubFile] = []
        while url:
            data, response = await self._get_json(url, repo, revision)
            if not isinstance(data, list):
                raise WeightsError(f"{url}: expected a JSON list of files")
            for entry in data:
                if not isinstance(entry, dict) or entry.get("type") != "file":
                    continue
                lfs_entry = entry.get("lfs")
                lfs: dict[str, Any] = lfs_entry if isinstance(lfs_entry, dict) else {}
                oid = str(lfs.get("oid") or "").lower()
                files.append(
                    HubFile(
                        path=str(entry.get("path", "")),
                        size=int(entry.get("size") or lfs.get("size") or 0),
                        sha256=oid if is_sha256(oid) else None,
                        git_oid=str(entry.get("oid") or "") or None,
                    )
                )
            next_link = response.links.get("next")
            url = str(next_link["url"]) if next_link else None
        return files

    async def read_start(self, repo: str, filename: str, revision: str | None, nbytes: int) -> bytes:
        """The first ``nbytes`` of a file (a ranged GET, nothing kept): a GGUF's header, a README, a config.json."""
        revision = revision or self.settings.revision
        url = f"{self.settings.endpoint}/{check_repo(repo)}/resolve/{quote(revision, safe='')}/{quote(_check_filename(filename))}"
        try:
            response, _ = await open_following(self.session, url, {**self._headers(), "Range": f"bytes=0-{nbytes - 1}"})
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            raise self._unreachable(err) from None
        try:
            if response.status >= 400:
                text = (await response.content.read(4096)).decode(errors="replace")
                raise self._error(HTTPRefusal(response.status, response.headers, text, url), repo, revision, filename)
            data = bytearray()
            while len(data) < nbytes and (chunk := await response.content.read(nbytes - len(data))):
                data += chunk  # a server that ignores the range sends the whole file: only the start is read
            return bytes(data)
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            raise self._unreachable(err) from None
        finally:
            response.release()

    async def choose(self, repo: str, revision: str | None = None) -> GGUFChoice:
        revision = revision or self.settings.revision
        return choose_gguf(await self.list_files(repo, revision), f"{repo}@{revision}")

    async def download(
        self,
        repo: str,
        filename: str,
        revision: str | None,
        dest_dir: Path | str,
        *,
        sha256: str | None = None,
        progress: Progress | None = None,
        listed: HubFile | None = None,
    ) -> Path:
        """One file, resumable and digest-checked, cached under ``dest_dir``; returns its path.

        The expected digest is ``sha256`` when given, else the listing's LFS id
        (``listed``), else the hub's ``X-Linked-Etag`` or a SHA-256 ``ETag``;
        a file kept in git is checked against its git object id. On a mismatch
        the file is removed and :class:`DigestMismatchError` says so.
        """
        revision = revision or self.settings.revision
        target = cache_path(dest_dir, repo, revision, filename)
        pinned = normalize_sha256(sha256, "sha256")
        what = f"{repo}@{revision}: {filename}"
        if pinned and listed is not None and listed.sha256 and listed.sha256 != pinned:
            raise WeightsError(
                f"{what}: the hub lists sha256 {listed.sha256} but {pinned} is pinned: pin the revision that has that file "
                f"({contract_env.ENV_MODEL_REVISION}) or correct the pin ({contract_env.ENV_MODEL_SHA256} / source.sha256)"
            )

        def cached() -> Path | None:
            if not target.is_file():
                return None
            if pinned and known_digest(target) != pinned:
                remove_with_record(target)  # another pin, or damage since: fetch again
                return None
            return target

        if (hit := cached()) is not None:
            return hit
        async with async_file_lock(target):
            if (hit := cached()) is not None:
                return hit
            return await self._fetch_into(repo, filename, revision, target, pinned, listed, progress, what)

    async def _fetch_into(
        self,
        repo: str,
        filename: str,
        revision: str,
        target: Path,
        pinned: str | None,
        listed: HubFile | None,
        progress: Progress | None,
        what: str,
    ) -> Path:
        url = f"{self.settings.endpoint}/{repo}/resolve/{quote(revision, safe='')}/{quote(filename)}"
        part = target.with_name(target.name + ".part")

        def expected_from(headers: Mapping[str, str]) -> tuple[str | None, str]:
            if pinned:
                return pinned, "the pinned value"
            if listed is not None and listed.sha256:
                return listed.sha256, "the hub's file listing"
            linked = _strip_etag(headers.get("X-Linked-Etag"))
            if is_sha256(linked):
                return linked, "the hub's X-Linked-Etag"
            etag = _strip_etag(headers.get("ETag"))
            if is_sha256(etag):
                return etag, "the ETag"
            return None, ""

        def check_announced(headers: Mapping[str, str]) -> None:
            said = _strip_etag(headers.get("X-Linked-Etag"))
            if pinned and is_sha256(said) and said != pinned:
                raise WeightsError(
                    f"{what}: the hub says this file's sha256 is {said} but {pinned} is pinned, so nothing was downloaded: "
                    f"pin the revision that has that file ({contract_env.ENV_MODEL_REVISION}) or correct the pin"
                )

        size_hint = listed.size if listed is not None and listed.size else None
        try:
            fetched = await fetch_resumable(
                self.session,
                url,
                part,
                headers=self._headers(),
                progress=progress,
                size_hint=size_hint,
                on_headers=check_announced,
                attempts=self.attempts,
                backoff_s=self.backoff_s,
            )
        except HTTPRefusal as refusal:
            raise self._error(refusal, repo, revision, filename) from None
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            raise self._unreachable(err) from None
        # The hub's own headers (first hop) win over the CDN's.
        seen = CIMultiDict(fetched.final_headers)
        seen.update(fetched.first_headers)
        expected, source = expected_from(seen)
        remedy = "Run the same command again to download it afresh; if it fails again, the hub or a mirror serves damaged bytes."
        if expected and fetched.sha256 != expected:
            part.unlink(missing_ok=True)
            raise DigestMismatchError(f"{what} (expected per {source})", expected, fetched.sha256, part, remedy)
        if not expected:
            git_oid = _strip_etag(fetched.first_headers.get("X-Linked-Etag") or fetched.first_headers.get("ETag"))
            if listed is not None and listed.git_oid and _GIT_OID.match(listed.git_oid):
                git_oid = listed.git_oid
            if _GIT_OID.match(git_oid) and (actual := _git_blob_oid(part)) != git_oid:
                part.unlink(missing_ok=True)
                raise DigestMismatchError(f"{what} (git object id)", git_oid, actual, part, remedy)
        os.replace(part, target)
        with contextlib.suppress(OSError):
            record_digest(target, fetched.sha256)
        return target

    async def fetch_model(
        self,
        repo: str,
        filename: str | None = None,
        *,
        dest_dir: Path | str,
        revision: str | None = None,
        sha256: str | None = None,
        progress: Progress | None = None,
    ) -> Path:
        """The model file of ``repo`` (``filename``, or the chosen GGUF), with ``OPOD_MODEL_SHA256`` as the default pin.

        A model split into parts is downloaded whole; the path of the first part is returned.
        """
        revision = revision or self.settings.revision
        pinned = sha256 or self.settings.sha256
        if filename:
            return await self.download(repo, filename, revision, dest_dir, sha256=pinned, progress=progress)
        choice = await self.choose(repo, revision)
        if pinned and len(choice.files) > 1:
            raise WeightsError(
                f"{repo}@{revision}: {choice.first.path} is split into {len(choice.files)} parts, and one sha256 cannot pin them all: "
                f"unset {contract_env.ENV_MODEL_SHA256} (each part is still checked against the hub's digest) or name a file"
            )
        total, before = choice.size, 0
        for part in choice.files:

            def overall(done: int, _total: int | None, _before: int = before) -> None:
                if progress:
                    progress(_before + done, total)

            await self.download(repo, part.path, revision, dest_dir, sha256=pinned, progress=overall, listed=part)
            before += part.size
        return cache_path(dest_dir, repo, revision, choice.first.path)


# Module-level calls: one session each, settings from the environment.


async def list_files(repo: str, revision: str | None = None) -> list[HubFile]:
    async with HubClient() as hub:
        return await hub.list_files(repo, revision)


async def model_info(repo: str, revision: str | None = None) -> ModelInfo:
    async with HubClient() as hub:
        return await hub.model_info(repo, revision)


async def download(
    repo: str,
    filename: str,
    revision: str | None,
    dest_dir: Path | str,
    *,
    sha256: str | None = None,
    progress: Progress | None = None,
) -> Path:
    async with HubClient() as hub:
        return await hub.download(repo, filename, revision, dest_dir, sha256=sha256, progress=progress)


async def fetch_model(
    repo: str,
    filename: str | None = None,
    *,
    dest_dir: Path | str,
    revision: str | None = None,
    sha256: str | None = None,
    progress: Progress | None = None,
) -> Path:
    async with HubClient() as hub:
        return await hub.fetch_model(
            repo, filename, dest_dir=dest_dir, revision=revision, sha256=sha256, progress=progress
        )


def run_sync(coroutine: Coroutine[Any, Any, _T] | Awaitable[_T]) -> _T:
    """Run a coroutine from synchronous code; inside a running event loop, await the async call instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)  # type: ignore[arg-type]
    if asyncio.iscoroutine(coroutine):
        coroutine.close()
    raise RuntimeError("called the synchronous hub API inside a running event loop: await the async function instead")


def list_files_sync(repo: str, revision: str | None = None) -> list[HubFile]:
    return run_sync(list_files(repo, revision))


def download_sync(
    repo: str,
    filename: str,
    revision: str | None,
    dest_dir: Path | str,
    *,
    sha256: str | None = None,
    progress: Progress | None = None,
) -> Path:
    return run_sync(download(repo, filename, revision, dest_dir, sha256=sha256, progress=progress))


def fetch_model_sync(
    repo: str,
    filename: str | None = None,
    *,
    dest_dir: Path | str,
    revision: str | None = None,
    sha256: str | None = None,
    progress: Progress | None = None,
) -> Path:
    return run_sync(fetch_model(repo, filename, dest_dir=dest_dir, revision=revision, sha256=sha256, progress=progress))
