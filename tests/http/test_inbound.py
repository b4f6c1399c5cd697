"""A client's JSON, held to the rules every listener reads it by, before anything parses it."""

from __future__ import annotations

import json

import pytest

from opod.http.errors import BadRequest
from opod.http.inbound import MAX_NESTING, json_object, json_value


def refusal(body: bytes | str) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        json_value(body)
    return caught.value


def test_nesting_up_to_the_limit_is_read_and_one_level_more_is_refused_naming_the_limit() -> None:
    assert json_value("[" * MAX_NESTING + "]" * MAX_NESTING) is not None
    assert json_value('{"a": ' * MAX_NESTING + "1" + "}" * MAX_NESTING) is not None
    deep = refusal("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1))
    assert f"nested at most {MAX_NESTING} levels" in deep.message and deep.status == 400
    assert "nested at most" in refusal('{"a": [' * 100 + "]}" * 100).message, "objects and arrays alike"


def test_brackets_in_text_are_not_levels_and_broken_json_is_refused_either_way() -> None:
    text = '"' + "[{" * 3000 + '\\" ]]' + '"'
    assert json_value(f'{{"content": {text}, "more": [{", ".join(["[]"] * 500)}]}}')["more"][0] == []
    assert "nested at most" in refusal("[" * 5000).message, "an array never closed is as deep as it opens"
    assert "not valid JSON" in refusal("[" * 10 + "}" * 10).message


def test_text_that_cannot_be_encoded_is_refused_naming_where_it_is() -> None:
    lone = refusal('{"messages": [{"role": "user", "content": "a\\ud800"}]}')
    assert lone.param == "messages[0].content" and "cannot be encoded" in lone.message
    assert refusal('["\\udc00"]').param == "[0]"
    assert refusal('{"\\ud800": 1}').param == "body (a key)"
    assert json_value('"\\ud83d\\ude00"') == "😀", "a whole pair is a character like any other"


def test_what_json_does_not_hold_is_refused_and_what_it_does_is_read() -> None:
    assert "NaN is not a JSON value" in refusal('{"temperature": NaN}').message
    assert "Infinity is not a JSON value" in refusal("[-Infinity]").message
    assert json_value("[" + "9" * 30 + "]")[0] > 1e29, "a number past 64 bits is read"
    with pytest.raises(BadRequest, match="must be a JSON object"):
        json_object(json.dumps([1]).encode())
