"""The shared refusals: OpenAI's error shape with every key, and honest status codes the ``openai`` client does not retry."""

from __future__ import annotations

import json

from opod.http.errors import (
    BadRequest,
    ContextLengthExceeded,
    MethodNotAllowed,
    NoCapacity,
    NotSupported,
    UnknownRoute,
    error_response,
)


def test_every_error_body_has_message_type_param_and_code() -> None:
    for error in (
        BadRequest("bad"),
        BadRequest("bad", param="messages"),
        NoCapacity("busy"),
        UnknownRoute("GET", "/v1/x", ["/v1/models"]),
    ):
        body = json.loads(error_response(error, "r1").body)
        assert set(body["error"]) == {"message", "type", "param", "code"}


def test_a_model_asked_for_work_it_does_not_do_is_a_400_naming_model() -> None:
    error = NotSupported("The model 'x' does not produce embeddings.", "embeddings_not_supported")
    assert (
        error.status == 400 and error.param == "model" and error.body()["error"]["code"] == "embeddings_not_supported"
    )


def test_a_prompt_over_the_context_carries_openais_code() -> None:
    error = ContextLengthExceeded("too long", param="messages")
    assert error.status == 400 and error.code == "context_length_exceeded"


def test_a_wrong_method_is_a_405_with_allow_and_an_unknown_path_a_404_listing_the_routes() -> None:
    response = error_response(MethodNotAllowed("GET", "/v1/chat/completions", ["POST"]), "r1")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    unknown = UnknownRoute("POST", "/v1/nope", ["/v1/chat/completions", "/v1/models"])
    assert unknown.status == 404 and "/v1/chat/completions" in unknown.message and "POST /v1/nope" in unknown.message
