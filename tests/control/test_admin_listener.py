"""The admin listener to the letter of the management API's conventions: the admin token on every path under
``/api`` (``openapi.json`` included), the listener's own refusals before the token is looked at, an ``ErrorView``
for every refusal and error, and ``X-Llmgw-Actor`` checked and recorded. Raw HTTP against a leader built in the
test's process, on its real admin listener on loopback."""

from __future__ import annotations

import http.client as httpclient
import json
from collections.abc import Iterator

import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, wait_until


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("admin") / "home")
    yield up
    up.stop()


def call(
    leader: Leader,
    method: str,
    path: str,
    body: bytes | None = None,
    key: str | None = "admin",
    chunked: bool = False,
    **headers: str,
) -> tuple[int, dict, object]:
    """One raw request, with exactly the headers given (``Host`` is the listener's address unless given); a
    ``chunked`` body is sent without ``Content-Length``, in 1 MiB chunks."""
    conn = httpclient.HTTPConnection("127.0.0.1", leader.admin_port, timeout=30)
    sent = {k.replace("_", "-"): v for k, v in headers.items()}
    if key == "admin":
        sent["Authorization"] = f"Bearer {leader.key}"
    elif key:
        sent["Authorization"] = f"Bearer {key}"
    conn.putrequest(method, path, skip_host="Host" in sent, skip_accept_encoding=True)
    for name, value in sent.items():
        conn.putheader(name, value)
    if chunked and body is not None:
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        for start in range(0, len(body), 1 << 20):
            piece = body[start : start + (1 << 20)]
            conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        conn.send(b"0\r\n\r\n")
    else:
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
    response = conn.getresponse()
    raw = response.read() if method != "HEAD" else b""
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(raw) if raw else None


def error_view(body: object) -> str:
    assert isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    return body["error"]


def test_openapi_json_needs_the_admin_token(leader: Leader) -> None:
    status, _, body = call(leader, "GET", "/api/v1/openapi.json", key=None)
    assert status == 401 and "admin" in error_view(body)
    status, _, body = call(leader, "GET", "/api/v1/openapi.json")
    assert status == 200 and isinstance(body, dict) and "paths" in body


def test_unknown_paths_and_wrong_methods_answer_an_error_view(leader: Leader) -> None:
    status, _, body = call(leader, "GET", "/api/v1/no-such-thing")
    assert status == 404 and "/api/v1/no-such-thing" in error_view(body)
    status, headers, body = call(leader, "PATCH", "/api/v1/keys", b"{}", Content_Type="application/json")
    assert status == 405 and "PATCH" in error_view(body) and "GET" in headers["allow"]
    status, _, body = call(leader, "POST", "/api/v1/keys", b'["not", "an object"]', Content_Type="application/json")
    assert status == 400 and error_view(body)


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec_Fetch_Site": "cross-site"},
        {"Sec_Fetch_Site": "same-site"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
    ],
)
def test_a_request_another_sites_page_sent_is_refused_before_the_token(leader: Leader, headers: dict[str, str]) -> None:
    status, _, body = call(leader, "GET", "/api/v1/keys", key=None, **headers)
    assert status == 403 and "another site" in error_view(body)


def test_the_listeners_own_origin_and_a_direct_call_pass(leader: Leader) -> None:
    own = f"http://127.0.0.1:{leader.admin_port}"
    assert call(leader, "GET", "/api/v1/keys", Origin=own, Sec_Fetch_Site="same-origin")[0] == 200
    assert call(leader, "GET", "/api/v1/keys", Sec_Fetch_Site="none")[0] == 200


def test_a_host_that_is_a_name_is_refused(leader: Leader) -> None:
    status, _, body = call(leader, "GET", "/api/v1/keys", key=None, Host="rebound.example:9090")
    assert status == 403 and "IP address or localhost" in error_view(body)
    assert call(leader, "GET", "/api/v1/keys", Host=f"localhost:{leader.admin_port}")[0] == 200


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonfoo", "application/json+x"],
)
def test_a_change_without_a_json_content_type_is_refused_even_without_a_body(
    leader: Leader, content_type: str | None
) -> None:
    headers = {"Content_Type": content_type} if content_type else {}
    status, _, body = call(leader, "POST", "/api/v1/node-tokens", b'{"name": "x"}' if content_type else None, **headers)
    assert status == 415 and "application/json" in error_view(body)


def test_the_actor_is_checked_and_recorded(leader: Leader) -> None:
    status, _, body = call(
        leader,
        "POST",
        "/api/v1/node-tokens",
        b'{"name": "by-alice"}',
        Content_Type="application/json",
        X_Llmgw_Actor="alice bob",
    )
    assert status == 400 and "X-Llmgw-Actor" in error_view(body)
    status, _, _ = call(
        leader,
        "POST",
        "/api/v1/node-tokens",
        b'{"name": "by-alice"}',
        Content_Type="application/json",
        X_Llmgw_Actor="alice@ops.example",
    )
    assert status in (200, 201)
    assert "alice@ops.example" in wait_for_actors(leader)
    call(leader, "POST", "/api/v1/node-tokens", b'{"name": "anonymous"}', Content_Type="application/json")
    assert "unknown" in wait_for_actors(leader, "unknown")


def wait_for_actors(leader: Leader, expected: str = "alice@ops.example") -> set[str]:
    """The actors of the ``admin.call`` events the leader recorded (its event stream), once ``expected`` is among them."""

    def actors() -> set[str] | None:
        status, _, body = http("GET", leader.url + "/admin/v1/events/stream?after=0&limit=1000", key=leader.key)
        assert status == 200 and isinstance(body, dict), body
        found = {
            str((e.get("data") or {}).get("actor")) for e in body.get("events") or [] if e.get("type") == "admin.call"
        }
        return found if expected in found else None

    return wait_until(actors, 10, f"an admin.call event by {expected}")


def test_a_missing_or_wrong_body_is_named(leader: Leader) -> None:
    status, _, body = call(leader, "POST", "/api/v1/keys", Content_Type="application/json")
    assert status == 400 and error_view(body).startswith("body: send a JSON object")
    status, _, body = call(leader, "POST", "/api/v1/keys", b'{"name": 5}', Content_Type="application/json")
    assert status == 400 and error_view(body).startswith("name:")
    status, _, body = call(leader, "POST", "/api/v1/keys", b'{"colour": "red"}', Content_Type="application/json")
    assert status == 400 and "colour" in error_view(body)


@pytest.mark.parametrize("content_type", ["Application/JSON", "application/json; charset=utf-8", "APPLICATION/json"])
def test_json_is_json_in_any_case_and_with_parameters(leader: Leader, content_type: str) -> None:
    status, _, body = call(leader, "POST", "/api/v1/node-tokens", b'{"name": "cased"}', Content_Type=content_type)
    assert status == 201, body


def test_head_answers_what_get_answers_without_the_body(leader: Leader) -> None:
    got_status, got_headers, got = call(leader, "GET", "/api/v1/keys")
    status, headers, body = call(leader, "HEAD", "/api/v1/keys")
    assert (status, body) == (got_status, None) and got_status == 200
    assert headers["content-type"] == got_headers["content-type"] == "application/json"
    assert headers["content-length"] == got_headers["content-length"]
    assert call(leader, "HEAD", "/api/v1/keys", key=None)[0] == 401


def test_a_body_past_the_cap_is_refused_whether_or_not_it_said_its_size(leader: Leader) -> None:
    big = b'{"name": "' + b"x" * (9 << 20) + b'"}'
    for chunked in (False, True):
        status, _, body = call(
            leader, "POST", "/api/v1/node-tokens", big, chunked=chunked, Content_Type="application/json"
        )
        assert status == 413 and "at most" in error_view(body), chunked
    # A chunked body under the cap is read whole and taken.
    status, _, body = call(
        leader, "POST", "/api/v1/node-tokens", b'{"name": "in pieces"}', chunked=True, Content_Type="application/json"
    )
    assert status == 201, body
