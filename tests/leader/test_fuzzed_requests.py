"""Hypothesis-made requests to ``/v1`` and ``/admin/v1`` of a real leader: no answer is ever a 5xx.

``/api/v1`` is driven by its specification (``tests/control/test_schema_driven.py``); these two APIs have
no schema of their own to generate from, so their requests are drawn here: for each route, bodies of
the fields it reads with plausible values, and as often as not one value in it (at the top or deep
inside) replaced by any JSON at all (nested, huge integers, lone surrogates, wrong types), another
model, fields no route knows, or a body that is not a JSON object. Every answer must be below 500,
every refusal in the API's own error shape with a message that does not repeat the whole of what
was sent, and enough of the plausible requests must get past the rules to an engine.

The leader is built in this process; its worker is a real ``opod join`` with simulator engines, so a
request that passes every rule is answered by an engine (with its latencies set to zero). The run is
derandomized and sized to stay within a minute or two on two cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opod.contract.features import frozen_routes
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, opod_cli, sim_worker

CHAT, EMBED, RERANK = "fuzz-chat", "all-minilm-l6-v2", "bge-reranker-v2-m3-gguf"
EXAMPLES = 40
"""Requests per route: enough to reach each rule's refusals, few enough for CI."""
LONGEST_MESSAGE = 2000
"""An error message is at most this long: what a client sent is never repeated whole."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessLeader]:
    root = tmp_path_factory.mktemp("fuzzed")
    leader = InProcessLeader(root / "leader")
    worker: OpodProcess = sim_worker(leader, root / "worker", "n1")
    try:
        worker.wait_for_line("registered with", timeout=30)
        fast = [{"engine": "sim", "args": ["--time-scale", "0", "--output-min", "1", "--output-max", "8"]}]
        status, body = leader.admin("POST", "/api/v1/models", {"name": CHAT, "profiles": fast, "scaling": {"min": 1}})
        assert status == 200, body
        for name in (EMBED, RERANK):
            added = opod_cli(leader, "model", "add", name, "--engine", "sim")
            assert added.returncode == 0, added.stderr
        leader.wait_served(CHAT, RERANK, EMBED, timeout=90)
        yield leader
    finally:
        worker.stop()
        leader.stop()


@pytest.fixture(scope="module")
def session(fleet: InProcessLeader) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet.url, timeout=60) as http:
        yield http


# --- what is drawn ---------------------------------------------------------------------------------

text = st.text(alphabet=st.characters(codec=None), max_size=12)
"""Any text, lone surrogates included (JSON escapes them; a client can send them)."""
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
anything = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8
)
"""Any JSON value."""

count = st.integers(min_value=1, max_value=4)
unit = st.floats(min_value=0, max_value=1)
words = st.sampled_from(["Hello", "Write one word", "é ü 中文", "", "a" * 300])
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "text", "text", "image_url", "refusal", "video"])},
    optional={"text": words, "image_url": st.just({"url": "data:image/png;base64,AAAA"})},
)
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
message = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": words | st.lists(part, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant"]), "content": words}),
    st.just({"role": "assistant", "content": None, "tool_calls": [CALL]}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": words, "tool_call_id": st.just("c1")}),
)
tool = st.just({"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}})
Shape = tuple[dict[str, st.SearchStrategy[Any]], dict[str, st.SearchStrategy[Any]]]
"""A body's required fields and its optional ones, each with its plausible values."""

sampling = {
    "max_tokens": count,
    "max_completion_tokens": count,
    "temperature": unit,
    "top_p": unit,
    "n": count,
    "stop": words | st.lists(words, max_size=5),
    "stream": st.booleans(),
    "stream_options": st.just({"include_usage": True}),
    "logit_bias": st.dictionaries(st.sampled_from(["15", "16", "abc", "-1", "99999999999"]), count, max_size=2),
    "logprobs": st.booleans(),
    "top_logprobs": count,
    "seed": count,
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "xml"}]),
    "presence_penalty": unit,
    "user": words,
}
SHAPES: dict[str, Shape] = {
    "/v1/chat/completions": (
        {"model": st.just(CHAT), "messages": st.lists(message, min_size=1, max_size=3)},
        {**sampling, "tools": st.lists(tool, max_size=2), "tool_choice": st.sampled_from(["auto", "none", "any"])},
    ),
    "/v1/completions": (
        {"model": st.just(CHAT), "prompt": words | st.lists(words, max_size=3) | st.lists(count, max_size=3)},
        {**sampling, "echo": st.booleans(), "best_of": count},
    ),
    "/v1/embeddings": (
        {"model": st.just(EMBED), "input": words | st.lists(words, max_size=3) | st.lists(count, max_size=3)},
        {
            "dimensions": count | st.just(384),
            "encoding_format": st.sampled_from(["float", "base64", "hex"]),
            "truncate_prompt_tokens": count,
        },
    ),
    "/v1/rerank": (
        {"model": st.just(RERANK), "query": words, "documents": st.lists(words | st.just({"text": "x"}), max_size=3)},
        {"top_n": count},
    ),
    "/v1/responses": (
        {"model": st.just(CHAT), "input": words | st.lists(message, max_size=2)},
        {
            "instructions": words,
            "max_output_tokens": count,
            "text": st.just({"format": {"type": "json_object"}}),
            "stream": st.booleans(),
            "temperature": unit,
            "previous_response_id": words,
            "max_tokens": count,
        },
    ),
    "/v1/batches": (
        {
            "input_file_id": st.sampled_from(["file-nope", ""]),
            "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/embeddings", "/v1/nope"]),
        },
        {"completion_window": st.sampled_from(["24h", "1h", "999999999999999999999h", "1d"])},
    ),
}
MODELS = st.sampled_from([CHAT, EMBED, RERANK, "auto", "no-such-model", f"{CHAT}:adapter", "x" * 5000])


@st.composite
def body(draw: st.DrawFn, shape: Shape) -> bytes:
    """A route's body as sent: its fields, plausible; then, as often as not, one value in it anything at all
    (at the top or deep inside), another model, fields no route knows, or a body that is not a JSON object."""
    required, optional = shape
    fields = json.loads(json.dumps(draw(st.fixed_dictionaries(required, optional=optional))))  # a copy to spoil
    spoil = draw(st.sampled_from(["none", "none", "none", "value", "value", "model", "extra", "not an object"]))
    if spoil == "value":
        holder, key = draw(st.sampled_from(places(fields) or [(fields, "model")]))
        holder[key] = draw(anything)
    elif spoil == "model":
        fields["model"] = draw(MODELS)
    elif spoil == "extra":
        fields.update(draw(st.dictionaries(text, anything, min_size=1, max_size=2)))
    elif spoil == "not an object":
        return draw(st.binary(max_size=40) | anything.map(lambda v: json.dumps(v).encode()))
    return json.dumps(fields).encode()


def places(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in a JSON value, outermost first."""
    found: list[tuple[Any, Any]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        found.append((value, key))
        found += places(inner)
    return found


V1_ROUTES = {path: body(shape) for path, shape in SHAPES.items()}
STATUSES: dict[int, int] = {}
"""Answers by status in the test running, to check that drawn requests also get past the rules."""


def check_answer(response: httpx.Response, sent: bytes) -> None:
    STATUSES[response.status_code] = STATUSES.get(response.status_code, 0) + 1
    assert response.status_code < 500, f"{response.status_code} for {sent[:300]!r}: {response.text[:500]}"
    if response.status_code < 400:
        return
    error = response.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert isinstance(message, str) and message, response.text[:500]
    assert len(message) <= LONGEST_MESSAGE, f"a {len(message)}-character message for {sent[:200]!r}"


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("path", sorted(V1_ROUTES))
def test_no_v1_answer_is_a_server_error(fleet: InProcessLeader, session: httpx.Client, path: str) -> None:
    headers = {"Authorization": f"Bearer {fleet.key}", "Content-Type": "application/json"}

    @FUZZ
    @given(sent=V1_ROUTES[path])
    def one(sent: bytes) -> None:
        check_answer(session.post(path, content=sent, headers=headers), sent)

    STATUSES.clear()
    one()
    if path != "/v1/batches":  # no batch's input file exists: every one is refused
        assert STATUSES.get(200, 0) >= EXAMPLES // 10, f"too few requests reached an engine: {STATUSES}"


def test_no_v1_model_lookup_is_a_server_error(fleet: InProcessLeader, session: httpx.Client) -> None:
    @FUZZ
    @given(name=st.text(min_size=1, max_size=300))
    def one(name: str) -> None:
        response = session.get(f"/v1/models/{quote(name, safe='')}", headers={"Authorization": f"Bearer {fleet.key}"})
        check_answer(response, name.encode(errors="surrogatepass"))

    one()


def test_a_path_no_route_matches_is_answered_in_the_error_shape_of_its_api(fleet: InProcessLeader) -> None:
    headers = {"Authorization": f"Bearer {fleet.key}"}
    for path in ("/v1/models/a%0Ab", "/v1/x%0Ay"):  # a newline: no route's pattern matches it
        answer = httpx.get(fleet.url + path, headers=headers)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_url", answer.text
    answer = httpx.get(fleet.url + "/admin/v1/x%0Ay", headers=headers)
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "not_found", answer.text


# --- /admin/v1 ---------------------------------------------------------------------------------------------


def field(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A path's part or a query's value: mostly a plausible one, sometimes anything at all."""
    return st.one_of(plausible, plausible, plausible, anything)


ident = field(st.sampled_from(["n-nope", "m-nope", "", "a/b", "é"])).map(lambda v: quote(str(v), safe=""))
ADMIN_SHAPES: dict[str, Shape] = {
    "/admin/v1/models/{id}/load": ({}, {"node": st.just("n-nope")}),
    "/admin/v1/models/{id}/move": ({}, {"from": st.just("n1"), "to": st.just("n-nope")}),
    "/admin/v1/adapters": (
        {"base": st.just("m-nope"), "name": words, "source": words},
        {"rank": count, "node": st.just("n-nope")},
    ),
    "/admin/v1/shards/create": ({"model": st.just("m-nope")}, {"shards": count}),
}
paging = st.fixed_dictionaries(
    {},
    optional={
        "after": field(st.integers(min_value=-5, max_value=2**70)),
        "limit": field(st.integers(min_value=-5, max_value=2**70)),
    },
)
SKIPPED = frozenset({"/admin/v1/nodes/{id}/drain", "/admin/v1/nodes/{id}/sleep"})
"""Drawn ids never name the fixture's node, but these would take it out for the routes after them if one did."""


def admin_routes(leader: InProcessLeader) -> list[tuple[str, str]]:
    """Every (method, path) the public listener answers under ``/admin/v1``, from its own route table."""
    app = leader.leader.public_app().app
    found = {
        (method, route.path)
        for route in app.routes
        if getattr(route, "path", "").startswith("/admin/v1/")
        for method in (getattr(route, "methods", None) or ())
        if method != "HEAD"
    }
    return sorted(found - {(m, p) for m, p in found if p in SKIPPED})


def test_no_admin_v1_answer_is_a_server_error(fleet: InProcessLeader, session: httpx.Client) -> None:
    routes = admin_routes(fleet)
    frozen = {(r.method, r.path) for r in frozen_routes() if r.path.startswith("/admin/v1/") and r.path not in SKIPPED}
    assert frozen <= set(routes), frozen - set(routes)
    headers = {"Authorization": f"Bearer {fleet.key}", "Content-Type": "application/json"}

    @settings(FUZZ, max_examples=3 * EXAMPLES)
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        method, template = data.draw(st.sampled_from(routes))
        path = template
        for name in ("{id}", "{name}", "{model_id}", "{gang_id}"):
            path = path.replace(name, data.draw(ident))
        query = data.draw(paging) if method == "GET" else {}
        if template.startswith("/admin/v1/adapters/"):
            query = {"base": data.draw(field(st.just("m-nope")))}
        shape = ADMIN_SHAPES.get(template)
        sent = data.draw(body(shape)) if shape is not None else b""
        params = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in query.items()}
        response = session.request(method, path, params=params, content=sent, headers=headers)
        check_answer(response, sent or path.encode())

    one()
