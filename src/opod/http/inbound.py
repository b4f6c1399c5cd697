"""Reading a client's request on any listener: its id, and its body under a cap.

A body over its route's cap is refused with 413 (:class:`~opod.http.errors.BodyTooLarge`); up to
``DRAIN_LIMIT`` of it is read and dropped first so the client can read the refusal.
"""

from __future__ import annotations

import itertools
import secrets

from starlette.requests import Request

from opod.http import fastjson
from opod.http.errors import BadRequest, BodyTooLarge
from opod.http.fastpath import read_whole

MiB = 1 << 20

_ids = itertools.count(1)
_ID_PREFIX = "req_" + secrets.token_hex(4)


def request_id_for(request: Request) -> str:
    """The client's ``X-Request-Id`` when it is sane, else a new one unique to this process and boot."""
    return sane_request_id(request.headers.get("x-request-id"))


def sane_request_id(given: str | bytes | None) -> str:
    """``given`` (an ``X-Request-Id``) when it is sane, else a new id unique to this process and boot."""
    if given and len(given) <= 128 and given.isascii():
        text = given if isinstance(given, str) else given.decode("ascii")
        if text.isprintable():
            return text
    return f"{_ID_PREFIX}{next(_ids):x}"


DRAIN_LIMIT = 64 * MiB
"""How much of an oversized body is read and dropped so the client can read its 413; beyond it, the connection closes."""


async def read_body(request: Request, cap: int) -> bytes:
    whole = read_whole(request)
    if whole is not None and len(whole) <= cap:
        return whole
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        await _drain(request, int(length))
        raise BodyTooLarge(cap)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            await _drain(request, DRAIN_LIMIT)
            raise BodyTooLarge(cap)
        chunks.append(chunk)
    return b"".join(chunks)


async def _drain(request: Request, expected: int) -> None:
    if expected > DRAIN_LIMIT:
        return
    drained = 0
    async for chunk in request.stream():
        drained += len(chunk)
        if drained > DRAIN_LIMIT:
            return


def json_object(body: bytes) -> dict:
    """A request body that must be one JSON object, parsed; a :class:`BadRequest` saying what is wrong otherwise."""
    try:
        payload = fastjson.loads(body)
    except ValueError as err:
        raise BadRequest(f"The body is not valid JSON: {err}.") from None
    if not isinstance(payload, dict):
        raise BadRequest("The body must be a JSON object.")
    return payload
