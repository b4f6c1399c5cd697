"""Which requests' bodies are kept, how a streamed answer becomes its text, and OpenAI's user and metadata as labels."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from starlette.responses import StreamingResponse

from opod.gateway.kept_bodies import (
    KEPT,
    NO_STORE,
    OFF,
    PROJECT_OFF,
    BodyKeeping,
    StreamText,
    capped,
    request_labels,
)
from opod.http.fastpath import PreparedResponse
from opod.ledger.bodies import OfferedBody, stored
from opod.settings.schema import ClusterSettings
from opod.store.requests import BODY_COLUMNS, checked_body


class Sink:
    def __init__(self) -> None:
        self.bodies: list[OfferedBody] = []

    def offer(self, body: OfferedBody) -> bool:
        self.bodies.append(body)
        return True


def keeping(retention: dict) -> BodyKeeping:
    settings = ClusterSettings.model_validate({"retention": retention})
    names = {"project:acme/ml/private": "p_private"}

    def resolve(text: str) -> str:
        return names[text]

    return BodyKeeping(lambda: settings, Sink(), resolve)


def test_bodies_are_kept_only_where_the_settings_say_and_never_for_store_false() -> None:
    assert keeping({}).plan("p_chat", {}) == (OFF, None)
    on = keeping(
        {
            "bodies": True,
            "body_max_bytes": 100,
            "bodies_days": 2,
            "projects": {"project:acme/ml/private": {"bodies": False}, "p_big": {"body_max_bytes": 999}},
        }
    )
    state, plan = on.plan("p_chat", {})
    assert state == KEPT and plan is not None and (plan.max_bytes, plan.days) == (100, 2)
    assert on.plan("p_chat", {"store": False}) == (NO_STORE, None)
    assert on.plan("p_private", {}) == (PROJECT_OFF, None)
    state, plan = on.plan("p_big", {})
    assert state == KEPT and plan is not None and plan.max_bytes == 999
    only_one = keeping({"projects": {"p_chat": {"bodies": True}}})
    assert only_one.plan("p_chat", {})[0] == KEPT and only_one.plan("p_other", {})[0] == OFF


def test_new_settings_decide_the_next_request() -> None:
    current = [ClusterSettings.model_validate({"retention": {"bodies": True, "body_max_bytes": 100}})]
    bodies = BodyKeeping(lambda: current[0], Sink(), lambda text: text)
    state, plan = bodies.plan("p_chat", {})
    assert state == KEPT and plan is not None and plan.max_bytes == 100
    current[0] = ClusterSettings.model_validate({"retention": {"bodies": True, "body_max_bytes": 7, "bodies_days": 3}})
    state, plan = bodies.plan("p_chat", {})
    assert state == KEPT and plan is not None and (plan.max_bytes, plan.days) == (7, 3)
    current[0] = ClusterSettings.model_validate({"retention": {}})
    assert bodies.plan("p_chat", {}) == (OFF, None)


def test_a_stream_is_kept_as_the_text_of_its_deltas_cut_at_the_cap() -> None:
    sse = (
        b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\ndata: {"choices":[{"delta":{"content":"lo "}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"w\xc3\xb6rld"}}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )
    whole = StreamText(1000)
    for i in range(0, len(sse), 7):  # events split across chunks anywhere
        whole.feed(sse[i : i + 7])
    assert whole.result() == ("Hello wörld", False)
    cut = StreamText(8)
    cut.feed(sse)
    assert cut.result() == ("Hello w", True)  # the cap falls inside "ö": the character is not split
    completions = StreamText(100)
    completions.feed(b'data: {"choices":[{"text":"abc"}]}\n\n')
    assert completions.result() == ("abc", False)


def test_capped_cuts_on_a_character() -> None:
    assert capped("aö".encode(), 2) == ("a", True)
    assert capped(b"abc", 3) == ("abc", False)
    assert capped(b"a\x00b", 9) == ("ab", False)
    assert capped(b"a\x00bc", 3) == ("ab", True)
    assert capped(b"ab\x00", 2) == ("ab", True)


def test_user_and_metadata_become_the_end_user_and_capped_tags() -> None:
    assert request_labels({}) == ("", None)
    assert request_labels({"user": "alice", "metadata": {"a": "1", "n": 2}}) == ("alice", {"a": "1"})
    end_user, tags = request_labels({"user": 7, "metadata": {f"k{i}": "v" * 600 for i in range(20)}})
    assert end_user == "" and tags is not None and len(tags) == 16 and all(len(v) == 512 for v in tags.values())


def kept(bodies: BodyKeeping) -> dict[str, object]:
    assert isinstance(bodies.sink, Sink)
    [offered] = bodies.sink.bodies
    row = stored(offered)
    assert (
        checked_body(row) is row
    )  # what the gateway offers, as the writer stores it, passes the store's rule as it is
    return dict(zip(BODY_COLUMNS, row))


def keep_args(request: bytes) -> dict[str, object]:
    return {
        "request_id": "r1",
        "project_id": "p_chat",
        "path": "/v1/chat/completions",
        "model": "m",
        "served_model": "m-fallback",
        "request": request,
    }


def test_a_whole_answer_is_offered_as_its_row_each_side_cut_at_the_cap() -> None:
    bodies = keeping({"bodies": True, "body_max_bytes": 8, "bodies_days": 2})
    _, plan = bodies.plan("p_chat", {})
    assert plan is not None
    answer = PreparedResponse('{"a":"ö\x00"}'.encode(), 201, [])
    before = datetime.now(UTC)
    assert bodies.keep(plan, **keep_args(b'{"x":1}'), response=answer, stream=False) is answer  # type: ignore[arg-type]
    row = kept(bodies)
    at, expires_at = row.pop("at"), row.pop("expires_at")
    assert isinstance(at, datetime) and isinstance(expires_at, datetime)
    assert before - timedelta(milliseconds=1) <= at <= datetime.now(UTC)
    assert abs(expires_at - at - timedelta(days=2)) <= timedelta(microseconds=1)
    assert row == {
        "request_id": "r1",
        "project_id": "p_chat",
        "path": "/v1/chat/completions",
        "model": "m",
        "served_model": "m-fallback",
        "status": 201,
        "request": '{"x":1}',
        "response": '{"a":"ö',
        "truncated": True,
    }


async def test_a_stream_is_offered_once_it_ends_with_the_text_of_its_deltas() -> None:
    bodies = keeping({"bodies": True, "bodies_days": 1})
    _, plan = bodies.plan("p_chat", {})
    assert plan is not None
    sse = [b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n', 'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n']

    async def chunks() -> AsyncIterator[str | bytes]:
        for chunk in sse:
            yield chunk

    response = StreamingResponse(chunks(), media_type="text/event-stream")
    assert bodies.keep(plan, **keep_args(b"{}"), response=response, stream=True) is response  # type: ignore[arg-type]
    assert isinstance(bodies.sink, Sink) and bodies.sink.bodies == []  # nothing yet: the answer is not whole
    assert [chunk async for chunk in response.body_iterator] == sse  # passed on unchanged
    row = kept(bodies)
    assert (row["status"], row["request"], row["response"], row["truncated"]) == (200, "{}", "Hello", False)
    assert abs(row["expires_at"] - row["at"] - timedelta(days=1)) <= timedelta(microseconds=1)  # type: ignore[operator]
