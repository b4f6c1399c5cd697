"""Durations as text: one grammar for query strings, key lifetimes and the settings."""

from __future__ import annotations

import pytest

from opod.contract.durations import LONGEST_SECONDS, TooLong, seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("720h", 720 * 3600.0),
        ("30d", 30 * 86400.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("250ms", 0.25),
        (" 24H ", 86400.0),
    ],
)
def test_durations_read_as_seconds(text: str, expected: float) -> None:
    assert seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "30 days", "h", "1.h", "-5m", "5"])
def test_anything_else_is_refused_naming_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration; write it like 720h, 30d"):
        seconds(text)


@pytest.mark.parametrize("text", ["999999999h", "36501d", "99999999999999999999d", "1" + "0" * 400 + "s"])
def test_a_duration_past_a_hundred_years_is_refused_so_every_date_it_moves_stays_a_date(text: str) -> None:
    with pytest.raises(TooLong, match="longer than the longest duration taken, 36500d"):
        seconds(text)
    assert seconds("36500d") == LONGEST_SECONDS
