"""What a ``/v1`` request's record keeps beyond its counts: its end user and tags, and its bodies.

Bodies are kept only where the cluster's settings say so (``retention.bodies``, or the project's
own entry in ``retention.projects``), never for a request that says ``"store": false``; each side
is cut to ``body_max_bytes`` and marked ``truncated``. A streamed answer is kept as the text its
deltas carried, not as raw SSE. The body goes to a :class:`BodySink` (the ledger's
``BodyKeeper``) once the answer is complete: never on the request's way to the engine. It goes as
the plain tuple of its row's values with its times in POSIX seconds (``opod.ledger.bodies.OfferedBody``),
the cheapest thing to make on the event loop; the writer's thread makes its row and the store checks it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import Response, StreamingResponse

from opod.http import fastjson
from opod.ledger.bodies import OfferedBody
from opod.settings.schema import ClusterSettings, ProjectRetention

KEPT, OFF, NO_STORE, PROJECT_OFF = "kept", "off", "no_store", "project_off"
"""A usage row's ``body_state``: why its body is kept or not."""

MAX_TAGS = 16
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 512
"""OpenAI's limits on ``metadata``; past them the rest is left out of the record (the request is not refused)."""
MAX_END_USER = 256


def request_labels(payload: dict[str, Any]) -> tuple[str, dict[str, str] | None]:
    """OpenAI's ``user`` and ``metadata`` (strings only, capped) as a request's end user and tags."""
    # Asked whether they are there first: most requests carry neither.
    user = payload["user"] if "user" in payload else None
    end_user = user[:MAX_END_USER] if isinstance(user, str) else ""
    if "metadata" not in payload:
        return end_user, None
    metadata = payload["metadata"]
    if not isinstance(metadata, dict) or not metadata:
        return end_user, None
    tags: dict[str, str] = {}
    for key, value in metadata.items():
        if len(tags) >= MAX_TAGS:
            break
        if isinstance(key, str) and isinstance(value, str):
            tags[key[:MAX_TAG_KEY]] = value[:MAX_TAG_VALUE]
    return end_user, tags or None


class BodySink(Protocol):
    """Where kept bodies go (``opod.ledger.bodies.BodyKeeper``): never blocks, False when dropped."""

    def offer(self, body: OfferedBody) -> bool: ...


@dataclass(frozen=True, slots=True)
class KeepPlan:
    """One request's body is kept: for this long, each side cut to ``max_bytes``."""

    max_bytes: int
    days: int
    lifetime_s: float = field(init=False, repr=False, compare=False)
    """``days`` in seconds, made once per plan rather than once per request."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lifetime_s", self.days * 86400.0)


class BodyKeeping:
    """Decides per request whether its bodies are kept, and hands them to the sink when its answer is whole."""

    def __init__(
        self, settings: Callable[[], ClusterSettings], sink: BodySink, resolve_project: Callable[[str], str]
    ) -> None:
        self.settings = settings
        """The settings in force (``SettingsHolder.current``), read per request."""
        self.sink = sink
        self.resolve_project = resolve_project
        """A project's scope text → its id (``Tenancy.resolve``); raises when it names none."""
        self._resolved: tuple[ClusterSettings | None, dict[str, str]] = (None, {})
        self._cluster_plan: tuple[ClusterSettings | None, KeepPlan | None] = (None, None)
        """The plan of a request without a retention entry of its project's, made once per settings object
        (replaced, not changed, when the settings change): it is asked for every request."""

    def plan(self, project_id: str, payload: dict[str, Any]) -> tuple[str, KeepPlan | None]:
        """The request's ``body_state`` and, when its bodies are kept, how."""
        current = self.settings()
        retention = current.retention
        own = self._project_entry(current, project_id) if project_id and retention.projects else None
        plan: KeepPlan | None
        if own is not None:
            bodies = retention.bodies if own.bodies is None else own.bodies
            if not bodies:
                return (PROJECT_OFF if own.bodies is False else OFF), None
            plan = KeepPlan(
                retention.body_max_bytes if own.body_max_bytes is None else own.body_max_bytes,
                retention.bodies_days if own.bodies_days is None else own.bodies_days,
            )
        else:
            made_for, plan = self._cluster_plan
            if made_for is not current:
                plan = KeepPlan(retention.body_max_bytes, retention.bodies_days) if retention.bodies else None
                self._cluster_plan = (current, plan)
            if plan is None:
                return OFF, None
        if payload.get("store") is False:
            return NO_STORE, None
        return KEPT, plan

    def _project_entry(self, current: ClusterSettings, project_id: str) -> ProjectRetention | None:
        made_for, ids = self._resolved
        if made_for is not current:
            ids = {}
            self._resolved = (current, ids)
        for text, entry in current.retention.projects.items():
            if text in (project_id, f"project:{project_id}"):
                return entry
            found = ids.get(text)
            if found is None:
                try:
                    found = ids[text] = self.resolve_project(text)
                except Exception:  # a project not (yet) there, or bad text: looked up again next time
                    continue
            if found == project_id:
                return entry
        return None

    def keep(
        self,
        plan: KeepPlan,
        *,
        request_id: str,
        project_id: str,
        path: str,
        model: str,
        served_model: str,
        request: bytes,
        response: Response,
        stream: bool,
    ) -> Response:
        """Hand the request and its answer to the sink: now for a whole answer, at its end for a stream
        (the answer is returned with its body wrapped, so the text is gathered as it goes)."""
        at = time.time()
        request_text, cut = capped(request, plan.max_bytes)
        # The row's values before its status, in the table's order (``OfferedBody``).
        head = (request_id, project_id, at, at + plan.lifetime_s, path, model, served_model)
        if stream and isinstance(response, StreamingResponse):
            response.body_iterator = self._gathering(
                response.body_iterator, response, plan.max_bytes, head, request_text, cut
            )
            return response
        answer, answer_cut = capped(bytes(response.body), plan.max_bytes)
        self.sink.offer((*head, response.status_code, request_text, answer, cut or answer_cut))
        return response

    async def _gathering(
        self,
        chunks: AsyncIterable[str | bytes | memoryview],
        response: StreamingResponse,
        max_bytes: int,
        head: tuple[str, str, float, float, str, str, str],
        request_text: str,
        cut: bool,
    ) -> AsyncIterator[str | bytes | memoryview]:
        """``chunks`` (``response``'s) passed on unchanged, the deltas' text gathered; the body offered once the
        stream ends."""
        text = StreamText(max_bytes)
        try:
            async for chunk in chunks:
                text.feed(
                    chunk
                    if isinstance(chunk, bytes)
                    else bytes(chunk)
                    if isinstance(chunk, memoryview)
                    else chunk.encode()
                )
                yield chunk
        finally:
            answer, answer_cut = text.result()
            self.sink.offer((*head, response.status_code, request_text, answer, cut or answer_cut))


def capped(data: bytes, max_bytes: int) -> tuple[str, bool]:
    """``data`` as text of at most ``max_bytes`` bytes (cut on a character), and whether it was cut."""
    over = len(data) > max_bytes
    text = (data[:max_bytes] if over else data).decode("utf-8", "ignore" if over else "replace")
    # A NUL byte is a NUL character in UTF-8: a body without one (nearly every body) needs no second step. The byte
    # is asked for as the int 0, which bytes find several times faster than the one-byte string.
    return (without_nul(text) if 0 in data else text), over


def without_nul(text: str) -> str:
    """``text`` without its NUL characters, which PostgreSQL cannot keep in text; looked for first, since replacing
    costs several times more than finding none."""
    return text.replace("\x00", "") if "\x00" in text else text


class StreamText:
    """The text of an SSE answer (chat deltas' ``content``, completions' ``text``), up to ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._pending = b""
        self._parts: list[str] = []
        self._size = 0
        self.truncated = False

    def feed(self, chunk: bytes) -> None:
        if self.truncated:
            return  # cut already: the rest of the stream is passed on unread
        data = self._pending + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return
        self._pending = data[end + 2 :]
        self._events(data[:end].split(b"\n\n"))

    def _events(self, events: Iterable[bytes]) -> None:
        for event in events:
            if self.truncated:
                return
            for line in event.split(b"\n"):
                if not line.startswith(b"data: {"):
                    continue
                try:
                    payload = fastjson.loads(line[6:])
                except ValueError:
                    continue
                choices = payload.get("choices") if isinstance(payload, dict) else None
                if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                    continue
                first = choices[0]
                delta = first.get("delta")
                part = delta.get("content") if isinstance(delta, dict) else first.get("text")
                if isinstance(part, str) and part:
                    self._add(part)

    def _add(self, part: str) -> None:
        size = len(part) if part.isascii() else len(part.encode())
        if self._size + size > self.max_bytes:
            room = self.max_bytes - self._size
            part = part.encode()[:room].decode("utf-8", "ignore")
            size = len(part.encode())
            self.truncated = True
        self._parts.append(part)
        self._size += size

    def result(self) -> tuple[str, bool]:
        if self._pending:
            self._events([self._pending])
            self._pending = b""
        return without_nul("".join(self._parts)), self.truncated
