"""What a kept body's fields may hold: one rule (``checked_body``), whichever way a body comes in, as a RequestBody
or as the gateway's row of values; a body breaking it is refused naming the field, and its batch keeps nothing."""

from __future__ import annotations

from dataclasses import astuple, fields, replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from opod.store import InvalidInput, NotFound, RequestBody, Store
from opod.store.base import MAX_TEXT
from opod.store.requests import BODY_COLUMNS, REQUEST_TEXT, RESPONSE_TEXT, checked_body

AT = datetime(2026, 3, 1, 12, 30, 5, 123_456, tzinfo=UTC)


def kept(request_id: str = "r1", **changes: object) -> RequestBody:
    body = RequestBody(
        request_id=request_id,
        project_id="prj_1",
        at=AT,
        expires_at=AT + timedelta(days=7),
        path="/v1/chat/completions",
        model="m",
        served_model="m-fallback",
        status=200,
        request='{"model": "m"}',
        response='{"choices": []}',
        truncated=False,
    )
    return replace(body, **changes)  # type: ignore[arg-type]


def test_a_rows_values_are_the_columns_in_order() -> None:
    assert BODY_COLUMNS == tuple(field.name for field in fields(RequestBody))
    assert (BODY_COLUMNS[REQUEST_TEXT], BODY_COLUMNS[RESPONSE_TEXT]) == ("request", "response")


def test_a_usual_body_passes_as_it_is_and_an_unusual_one_as_the_table_keeps_it() -> None:
    row = astuple(kept())
    assert checked_body(row) is row
    east = datetime(2026, 3, 1, 14, 30, 5, 123_456, tzinfo=timezone(timedelta(hours=2)))
    odd = checked_body(astuple(kept(at=east, truncated=1, request="ö" * MAX_TEXT * 2)))  # type: ignore[arg-type]
    assert (odd[2], odd[2].tzinfo, odd[-1], len(odd[REQUEST_TEXT])) == (AT, UTC, False, MAX_TEXT * 2)


BAD = [
    ({"request": "a\x00b"}, "the request body of request 'r1' must be text without NUL characters"),
    ({"response": b"{}"}, "the response body of request 'r1' must be text without NUL characters"),
    ({"request_id": " "}, "request_id must not be empty"),
    ({"request_id": "r" * (MAX_TEXT + 1)}, f"request_id is {MAX_TEXT + 1} characters long"),
    ({"project_id": None}, "project_id must be text, not NoneType"),
    ({"at": datetime(2026, 3, 1)}, "at 2026-03-01T00:00:00 has no timezone"),
    ({"expires_at": "2026-03-08"}, "expires_at must be a datetime, not str"),
    ({"path": "/v1\x00"}, "path contains a NUL character"),
    ({"model": 7}, "model must be text, not int"),
    ({"served_model": "s" * (MAX_TEXT + 1)}, f"served_model is {MAX_TEXT + 1} characters long"),
    ({"status": -1}, "status is -1; it must be from 0"),
    ({"status": True}, "status must be a whole number, not bool"),
]


@pytest.mark.parametrize(("changes", "message"), BAD)
def test_a_bad_field_is_refused_by_name_either_way_in(store: Store, changes: dict, message: str) -> None:
    bad = kept("bad", **changes) if "request_id" not in changes else kept(**changes)
    message = message.replace("'r1'", repr(bad.request_id))
    with pytest.raises(InvalidInput) as as_body:
        store.keep_request_bodies([kept("ok"), bad])
    with pytest.raises(InvalidInput) as as_row:
        store.keep_body_rows([astuple(kept("ok")), astuple(bad)])  # type: ignore[list-item]
    assert message in str(as_body.value) and str(as_body.value) == str(as_row.value)
    with pytest.raises(NotFound):
        store.get_request_body("ok")  # nothing of a refused batch is kept


def test_what_is_not_a_body_is_refused_by_what_it_is(store: Store) -> None:
    with pytest.raises(InvalidInput, match="must be a RequestBody, not tuple"):
        store.keep_request_bodies([astuple(kept())])  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="must be a tuple of its 11 values .* not RequestBody"):
        store.keep_body_rows([kept()])  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="must be a tuple of its 11 values"):
        store.keep_body_rows([astuple(kept())[:-1]])  # type: ignore[list-item]


def test_a_body_reads_back_as_it_was_given_either_way_in(store: Store) -> None:
    east = datetime(2026, 3, 1, 23, 59, 59, 999_999, tzinfo=timezone(timedelta(hours=2)))
    given = kept("as-body", at=east, expires_at=east + timedelta(days=1), request="nœud ✓", truncated=True)
    row = astuple(kept("as-row", model="modèle"))
    assert store.keep_request_bodies([given]) == 1
    assert store.keep_body_rows([row]) == 1  # type: ignore[list-item]
    assert store.get_request_body("as-body") == given
    assert store.get_request_body("as-body").at.tzinfo == UTC
    assert astuple(store.get_request_body("as-row")) == row
