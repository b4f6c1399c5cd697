"""One HTTP file download that survives a cut connection: a ``.part`` file resumed with ``Range``.

The bytes go to ``<name>.part`` and are hashed as they arrive, so the SHA-256
is known the moment the last byte lands. After a cut, the next request asks for
``Range: bytes=N-``; a 206 from byte N appends, and a server that ignores the
range (a 200 with the whole file) starts the part over from zero. Redirects are
followed by hand so the hub's own headers (``X-Linked-Etag``...) are kept from
the first hop, and so a token is never sent to another origin (a CDN).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import aiohttp
from multidict import CIMultiDict

from opod.weights.errors import WeightsError
from opod.weights.files import CHUNK, Progress

REDIRECTS = (301, 302, 303, 307, 308)
RETRYABLE = (429, 500, 502, 503, 504)
_MAX_REDIRECTS = 10
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class HTTPRefusal(Exception):
    """The server answered with an error status; the caller turns it into a message for its users."""

    def __init__(self, status: int, headers: Mapping[str, str], text: str, url: str) -> None:
        self.status = status
        self.headers = CIMultiDict(headers)
        self.text = text
        self.url = url
        super().__init__(f"HTTP {status} from {url}")


@dataclass
class Fetched:
    part: Path
    sha256: str
    size: int
    first_headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    """Headers of the first response (the hub's own, before any redirect)."""
    final_headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    resumed_from: list[int] = field(default_factory=list)
    """The offset of every request that asked for a range; empty when no resume happened."""


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


async def open_following(
    session: aiohttp.ClientSession,
    url: str,
    headers: Mapping[str, str],
    method: str = "GET",
    on_first: Callable[[CIMultiDict[str]], None] | None = None,
) -> tuple[aiohttp.ClientResponse, CIMultiDict[str]]:
    """Send the request and follow redirects; returns the final response (body unread) and the first hop's headers.

    ``Authorization`` goes only to the origin of ``url``: a redirect to a CDN
    must not carry the user's hub token. ``on_first`` sees the first hop's
    headers before any redirect is followed, and may raise to stop there.
    """
    origin = _origin(url)
    sent = dict(headers)
    first: CIMultiDict[str] | None = None
    for _ in range(_MAX_REDIRECTS + 1):
        response = await session.request(method, url, headers=sent, allow_redirects=False)
        if first is None:
            first = CIMultiDict(response.headers)
            if on_first is not None and response.status < 400:
                try:
                    on_first(first)
                except BaseException:
                    response.release()
                    raise
        if response.status not in REDIRECTS:
            return response, first
        location = response.headers.get("Location")
        response.release()
        if not location:
            raise WeightsError(f"{url} answered {response.status} without a Location header; the server is misbehaving")
        url = urljoin(url, location)
        if _origin(url) != origin:
            sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
    raise WeightsError(f"more than {_MAX_REDIRECTS} redirects from {url}; the server is misbehaving")


async def _refusal(response: aiohttp.ClientResponse) -> HTTPRefusal:
    try:
        text = (await response.content.read(4096)).decode(errors="replace")
    except (TimeoutError, aiohttp.ClientError):
        text = ""
    return HTTPRefusal(response.status, response.headers, text, str(response.url))


def _total(response: aiohttp.ClientResponse, offset: int, size_hint: int | None) -> int | None:
    if response.status == 206:
        match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if match and match.group(3) != "*":
            return int(match.group(3))
    length = response.headers.get("Content-Length")
    if length and length.isdigit():
        return offset + int(length) if response.status == 206 else int(length)
    return size_hint


async def fetch_resumable(
    session: aiohttp.ClientSession,
    url: str,
    part: Path,
    *,
    headers: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    size_hint: int | None = None,
    on_headers: Callable[[CIMultiDict[str]], None] | None = None,
    attempts: int = 4,
    backoff_s: float = 0.25,
) -> Fetched:
    """Download ``url`` into ``part``, resuming what is there; returns the complete part's size and SHA-256.

    A cut connection or a transient status (429, 5xx) is retried up to
    ``attempts`` times, each resuming where the last stopped. Any other error
    status raises :class:`HTTPRefusal`. ``on_headers`` sees the first hop's
    headers before any redirect is followed, and may raise to stop the download.
    """
    part.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    done = 0
    if part.exists():
        # Continue the digest over the bytes an earlier try kept.
        with part.open("rb") as kept:
            while block := kept.read(CHUNK):
                digest.update(block)
                done += len(block)
    result = Fetched(part, "", 0)
    last_problem = "no attempt made"
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(min(backoff_s * 2 ** (attempt - 1), 4.0))
        request_headers = {"Accept-Encoding": "identity", **(headers or {})}
        if done:
            request_headers["Range"] = f"bytes={done}-"
            result.resumed_from.append(done)
        try:
            response, first = await open_following(session, url, request_headers, on_first=on_headers)
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            last_problem = f"{type(err).__name__}: {err}"
            continue
        try:
            result.first_headers = first
            result.final_headers = CIMultiDict(response.headers)
            if response.status == 416 and done:
                # The range lies past the end: the kept part belongs to another file. Start over.
                part.unlink(missing_ok=True)
                digest, done = hashlib.sha256(), 0
                last_problem = "the server refused the resume range (416)"
                continue
            if response.status in RETRYABLE:
                last_problem = f"HTTP {response.status}"
                if attempt + 1 == attempts:
                    raise await _refusal(response)
                continue
            if response.status >= 400:
                raise await _refusal(response)
            if response.status == 206:
                match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
                if not match or int(match.group(1)) != done:
                    raise WeightsError(
                        f"{url}: asked for bytes from {done}, got {response.headers.get('Content-Range')!r}"
                    )
                mode = "ab"
            else:
                # A whole file (no range asked, or the server ignored it): the part starts over.
                digest, done, mode = hashlib.sha256(), 0, "wb"
            total = _total(response, done, size_hint)
            if progress:
                progress(done, total)
            try:
                with part.open(mode) as sink:
                    async for block in response.content.iter_chunked(CHUNK):
                        sink.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress:
                            progress(done, total)
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as err:
                last_problem = f"connection cut after {done} bytes ({type(err).__name__})"
                continue
            if total is not None and done != total:
                last_problem = f"the body ended at {done} of {total} bytes"
                continue
            result.sha256, result.size = digest.hexdigest(), done
            return result
        finally:
            response.release()
    raise WeightsError(
        f"download of {url} failed {attempts} times (last: {last_problem}); {done} bytes are kept in {part}: "
        "run the same command again to resume"
    )
