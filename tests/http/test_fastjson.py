"""The request path's JSON: the same text as the standard library's, including for what orjson refuses."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest

from opod.gateway.relay import _usage_of
from opod.http import fastjson


@pytest.mark.parametrize(
    "value",
    [
        {
            "rec": "end",
            "entry": "ab-1",
            "ts_us": 1764450000123456,
            "model": "sim-chat",
            "latency_ms": 225,
            "route_json": None,
        },
        {"why": "préfixe", "load": 14.5, "nested": {"list": [1, "two", None, True]}},
        {"huge": 2**80},  # past orjson's 64 bits
        {7: "an int key"},  # orjson takes text keys only
    ],
)
def test_dumps_writes_what_the_standard_library_writes(value: dict) -> None:
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    assert fastjson.dumps(value).decode() == expected


def test_values_json_cannot_hold_are_written_as_text() -> None:
    when = datetime(2026, 1, 2, tzinfo=UTC)
    assert json.loads(fastjson.dumps({"what": object, "when": when})) == {"what": str(object), "when": str(when)}


def test_a_journal_line_is_one_line_that_reads_back_the_same() -> None:
    for record in ({"rec": "start", "model": "modèle\nwith a newline"}, {"user": "lone \ud800 surrogate"}):
        line = fastjson.line(record)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert json.loads(line) == record


def test_loads_takes_what_the_standard_library_takes_and_refuses_the_rest() -> None:
    assert fastjson.loads(b'{"usage": {"prompt_tokens": 3}}') == {"usage": {"prompt_tokens": 3}}
    assert math.isnan(fastjson.loads(b'{"logprob": NaN}')["logprob"])  # engines do send NaN
    with pytest.raises(ValueError):
        fastjson.loads(b'{"usage": ')


def test_an_answer_with_nan_elsewhere_still_has_its_usage_counted() -> None:
    answer = b'{"choices": [{"logprobs": {"content": [{"logprob": -Infinity}]}}], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}'
    assert _usage_of(answer)[1] == {"prompt_tokens": 9, "completion_tokens": 4}
