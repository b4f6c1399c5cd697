"""Go's JSON text: floats without a trailing .0, Go's exponent spelling, Go's escaping."""

from __future__ import annotations

import pytest

from opod.contract import gojson


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (41.0, "41"),
        (62.5, "62.5"),
        (148.25, "148.25"),
        (0.0, "0"),
        (-0.0, "-0"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e-7, "1.5e-7"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (0.1 + 0.2, "0.30000000000000004"),
        (123456789.125, "123456789.125"),
    ],
)
def test_floats_are_written_as_go_writes_them(value: float, text: str) -> None:
    assert gojson.dumps(value) == text


def test_nan_cannot_be_marshalled() -> None:
    with pytest.raises(ValueError, match="NaN"):
        gojson.dumps(float("nan"))


def test_strings_escape_html_characters_and_line_separators_but_keep_utf8() -> None:
    assert gojson.dumps("<a&b>") == '"\\u003ca\\u0026b\\u003e"'
    assert gojson.dumps("x\u2028y\u2029") == '"x\\u2028y\\u2029"'
    assert gojson.dumps("zé日") == '"zé日"'
    assert gojson.dumps('q"\\\n\t\x01') == '"q\\"\\\\\\n\\t\\u0001"'


def test_compact_keeps_insertion_order_and_canonical_sorts_with_two_space_indent() -> None:
    body = {"b": 1, "a": [1, {"d": None, "c": True}], "e": {}, "f": []}
    assert gojson.dumps(body) == '{"b":1,"a":[1,{"d":null,"c":true}],"e":{},"f":[]}'
    assert gojson.canonical(body) == (
        '{\n  "a": [\n    1,\n    {\n      "c": true,\n      "d": null\n    }\n  ],\n'
        '  "b": 1,\n  "e": {},\n  "f": []\n}\n'
    )
