"""``response_format: json_object`` reaches every engine as the schema it stands for."""

from __future__ import annotations

from opod.gateway.routes import JSON_OBJECT_SCHEMA, json_object_as_schema


def test_json_object_without_a_schema_is_sent_as_an_object_schema() -> None:
    payload = {"model": "m", "response_format": {"type": "json_object"}}
    assert json_object_as_schema(payload) is True
    assert payload["response_format"] == {"type": "json_object", "schema": JSON_OBJECT_SCHEMA}


def test_a_given_schema_text_or_json_schema_format_is_left_as_the_client_sent_it() -> None:
    for response_format in (
        {"type": "json_object", "schema": {"type": "object", "required": ["name"]}},
        {"type": "text"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    ):
        payload = {"response_format": dict(response_format)}
        assert json_object_as_schema(payload) is False
        assert payload["response_format"] == response_format
    assert json_object_as_schema({"model": "m"}) is False
