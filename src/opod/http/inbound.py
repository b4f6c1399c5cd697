"""Reading a client's request on any listener: its id, its body under a cap, and the JSON in it.

A body over its route's cap is refused with 413 (:class:`~opod.http.errors.BodyTooLarge`); up to
``DRAIN_LIMIT`` of it is read and dropped first so the client can read the refusal.

JSON from a client is held to three rules before anything reads it, each refused with a 400
(:class:`~opod.http.errors.BadRequest`): arrays and objects nested at most ``MAX_NESTING`` deep
(checked on the bytes, before a parser recurses into them), text that can be encoded (no lone
UTF-16 surrogate such as ``\\ud800``, which no tokenizer, store or log can write), and no
``NaN`` or ``Infinity`` (not JSON).
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
from typing import Any

import orjson
from starlette.requests import Request

from opod.http.errors import BadRequest, BodyTooLarge, cut
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


def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object, parsed; a :class:`BadRequest` saying what is wrong otherwise."""
    payload = json_value(body)
    if not isinstance(payload, dict):
        raise BadRequest("The body must be a JSON object.")
    return payload


MAX_NESTING = 128
"""How deep a client's JSON may nest arrays and objects. Far above any real request (a JSON schema
in ``response_format`` nests a few dozen at most), far below where a recursive parser or walker
runs out of stack."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_value(body: bytes | str, what: str = "The body") -> Any:
    """``body`` parsed as a client's JSON, held to this module's rules; a :class:`BadRequest` naming what is
    wrong otherwise (``what`` names the text in the message: a batch's line, say)."""
    raw = body.encode() if isinstance(body, str) else body
    if raw.count(b"[") + raw.count(b"{") > MAX_NESTING:  # check_nesting's own first test, asked here: most pass it
        check_nesting(raw, what)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass  # orjson refuses lone surrogates and integers past 64 bits: the standard library says which
    try:
        value = json.loads(raw, parse_constant=_not_json)
    except ValueError as err:
        raise BadRequest(f"{what} is not valid JSON: {err}.") from None
    found = unencodable(value)
    if found is not None:
        where = cut(found)
        raise BadRequest(
            f"{where} holds text that cannot be encoded (a lone UTF-16 surrogate such as \\ud800, half of a pair); "
            "send the text as UTF-8, or escape whole surrogate pairs.",
            param=where,
        )
    return value


def check_nesting(body: bytes, what: str = "The body") -> None:
    """Refuse ``body`` when its arrays and objects nest deeper than :data:`MAX_NESTING`; bytes only, no parser.

    Most bodies hold fewer brackets than the limit, and are through after two counts. Otherwise the
    strings are cut out, the brackets kept, and empty pairs removed a round at a time: a round takes
    away one level, so more rounds than the limit is more levels (what is left when no pair can go is
    broken JSON, its open brackets counted as levels too).
    """
    if body.count(b"[") + body.count(b"{") <= MAX_NESTING:
        return
    brackets = _STRING.sub(b"", body).translate(_AS_BRACKETS, _NOT_BRACKETS)
    rounds = 0
    while rounds + brackets.count(b"[") > MAX_NESTING:
        fewer = brackets.replace(b"[]", b"")
        rounds += 1
        if len(fewer) == len(brackets) or rounds > MAX_NESTING:
            raise BadRequest(
                f"{what} nests arrays and objects more than {MAX_NESTING} deep; opod takes JSON nested at most "
                f"{MAX_NESTING} levels: flatten it."
            )
        brackets = fewer


def unencodable(value: Any, where: str = "") -> str | None:
    """Where in a parsed JSON value a text holds a lone surrogate (``messages[0].content``), or ``None``."""
    if isinstance(value, str):
        return where or "body" if not _encodes(value) else None
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = unencodable(item, f"{where}[{i}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            at = f"{where}.{key}" if where else key
            if not _encodes(key):
                return (where or "body") + " (a key)"
            found = unencodable(item, at)
            if found is not None:
                return found
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _not_json(constant: str) -> float:
    raise ValueError(f"{constant} is not a JSON value (send a number, or null)")
