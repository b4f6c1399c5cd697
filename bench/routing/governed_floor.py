"""A governed Python relay: the bare relay plus the work every governance area needs per request, and nothing else.

A yardstick, not a product: it asks how little CPU one Python hop can spend on a request while still
doing what ``python -m bench compare`` turns on in opod (``bench/compare/governance.py``), each the
shortest way, written as protocol callbacks on one event loop with no task, future or framework:

- a project's key, checked by its SHA-256 in a dictionary, attributing the request to project, team, org;
- the body parsed and its model and messages checked; ``max_tokens`` bounded;
- the guard policy ``screen`` (``bench/guard.py``): emails redacted in the request and a whole answer,
  card numbers and the injection pattern refused with 400 (opod's own expressions);
- a price and a budget: the request's most cost reserved before the engine, settled with its usage;
- an admission limit per model, and the engine with the fewest requests in flight;
- a journal line when the request is sent and one before its answer goes out (``os.write``), and its
  usage row and kept bodies committed to SQLite by a thread every 0.2 s, as opod's ledger does.

A streamed answer is passed through as it comes (its usage is not read), as the bare relay does.
Set beside opod and the bare relay in one run, the three figures split opod's CPU per request into
what one hop costs, what governance needs at the least, and what opod's own structure adds.

What it leaves out of opod's path, so that its figure is a floor and not a rival: OpenAI's request rules
beyond the model and the messages, the prompt's size by its chat template, canaries and plan
revisions, prefix routing (compare's chats are too short to be placed by opod either), retries before
the first byte and fallbacks, a stream's usage and progress lines, cancelling an engine's work when its
client leaves, the request record's finer fields (19 columns against opod's 30), and every check that
turns a bad value into a clear error instead of a crash.

Run from the checkout: ``python -m bench.routing.governed_floor PORT KEY MODEL DIR ENGINE_URL...``; it
prints ``ready`` once it listens. The guard policy's expressions are opod's own detectors and the bench's
injection pattern (``bench.guard``), not copies. ``KEY`` is the API key clients send; ``DIR`` holds its journal and database.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import re
import secrets
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools
import orjson
import uvloop

from bench import guard
from opod.gateway.guard import DETECTORS

EMAIL, CARD = DETECTORS["email"], DETECTORS["card"]
INJECTION = re.compile(guard.INJECTION)
PRICE_IN, PRICE_OUT = 0.5, 1.5  # per million tokens, as bench/compare/governance.py sets them
BUDGET_MICROS = 10**12
ADMIT = 1024
COMMIT_EVERY_S = 0.2
COLUMNS = (
    "entry request_id ts_us api_key_id project_id team_id org_id model protocol prompt_tokens completion_tokens "
    "latency_ms outcome node_id cost_micros status guard_action guard_policy body_state"
).split()


def _reply(status: int, body: bytes, request_id: bytes = b"") -> bytes:
    """A whole JSON answer (the reason phrase left empty, as HTTP/1.1 allows)."""
    return b"HTTP/1.1 %d \r\ncontent-type: application/json\r\ncontent-length: %d\r\nx-request-id: %s\r\n\r\n%s" % (
        status,
        len(body),
        request_id,
        body,
    )


class Ledger:
    """The journal (a line at the send, one at the end) and the store, committed by a thread every 0.2 s."""

    def __init__(self, directory: Path) -> None:
        self.fd = os.open(directory / "journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.db = sqlite3.connect(directory / "ledger.db", check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(
            f"CREATE TABLE IF NOT EXISTS usage (id INTEGER PRIMARY KEY, {', '.join(COLUMNS)}, UNIQUE (entry))"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS ix_usage_ts ON usage (ts_us)")
        self.db.execute("CREATE INDEX IF NOT EXISTS ix_usage_request_id ON usage (request_id)")
        self.db.execute("CREATE TABLE IF NOT EXISTS bodies (request_id PRIMARY KEY, project_id, request, response)")
        self.rows: list[tuple[Any, ...]] = []
        self.bodies: list[tuple[str, str, str, str]] = []
        self.insert = f"INSERT INTO usage ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
        threading.Thread(target=self._commit_loop, daemon=True).start()

    def line(self, record: dict[str, Any]) -> None:
        os.write(self.fd, orjson.dumps(record) + b"\n")

    def _commit_loop(self) -> None:
        while True:
            time.sleep(COMMIT_EVERY_S)
            rows, self.rows = self.rows, []
            bodies, self.bodies = self.bodies, []
            if rows or bodies:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.executemany(self.insert, rows)
                self.db.executemany("INSERT OR REPLACE INTO bodies VALUES (?, ?, ?, ?)", bodies)
                self.db.execute("COMMIT")


class Relay:
    def __init__(self, key: str, model: str, engines: list[tuple[str, int]], ledger: Ledger) -> None:
        self.keys = {hashlib.sha256(key.encode()).hexdigest(): ("key_bench", "prj_bench", "team_bench", "org_bench")}
        self.model = model
        self.engines = engines
        self.in_flight = [0] * len(engines)
        self.pools: list[list[Upstream]] = [[] for _ in engines]
        self.turn = itertools.count()
        self.admitted = 0
        self.budget_reserved = 0
        self.budget_spent = 0
        self.ledger = ledger
        self.prefix = secrets.token_hex(4) + "-"
        self.ids = itertools.count(1)

    def take(self, client: Downstream, headers: dict[bytes, bytes], body: bytes) -> None:
        """Check, reserve, admit and send one request; or answer it with its refusal."""
        request_id = headers.get(b"x-request-id") or b"req-%d" % next(self.ids)
        token = headers.get(b"authorization", b"").partition(b" ")[2]
        who = self.keys.get(hashlib.sha256(token).hexdigest())
        if who is None:
            client.transport.write(_reply(401, b'{"error":{"message":"unknown key"}}', request_id))
            return
        try:
            payload = orjson.loads(body)
            messages = payload["messages"]
            if payload.get("model") != self.model or not isinstance(messages, list):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            client.transport.write(_reply(400, b'{"error":{"message":"bad request"}}', request_id))
            return
        redacted, size = False, 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, str):
                continue
            size += len(content)
            if INJECTION.search(content) or CARD.findings(content):
                client.transport.write(_reply(400, b'{"error":{"message":"refused"}}', request_id))
                return
            if EMAIL.findings(content):
                message["content"], redacted = EMAIL.pattern.sub("[email]", content), True
        if redacted:
            body = orjson.dumps(payload)
        cap = payload.get("max_tokens") if isinstance(payload.get("max_tokens"), int) else 4096
        most = round((size + 64) * PRICE_IN + cap * PRICE_OUT)
        if self.budget_spent + self.budget_reserved + most > BUDGET_MICROS or self.admitted >= ADMIT:
            client.transport.write(_reply(429, b'{"error":{"message":"limited"}}', request_id))
            return
        self.budget_reserved += most
        self.admitted += 1
        least = min(self.in_flight)
        tied = [i for i, n in enumerate(self.in_flight) if n == least]
        engine = tied[next(self.turn) % len(tied)]
        self.in_flight[engine] += 1
        call = Call(self, client, who, request_id, engine, most, body, payload.get("stream") is True)
        pool = self.pools[engine]
        if pool:
            pool.pop().send(call)
        else:
            asyncio.get_running_loop().create_task(self._open(call))

    async def _open(self, call: Call) -> None:
        host, port = self.engines[call.engine]
        try:
            _, upstream = await asyncio.get_running_loop().create_connection(
                lambda: Upstream(self.pools[call.engine]), host, port
            )
        except OSError:
            call.fail()
            return
        upstream.send(call)


class Call:
    """One request between its send and its end."""

    __slots__ = ("relay", "client", "who", "request_id", "engine", "most", "body", "stream", "entry", "started")

    def __init__(
        self,
        relay: Relay,
        client: Downstream,
        who: tuple[str, ...],
        request_id: bytes,
        engine: int,
        most: int,
        body: bytes,
        stream: bool,
    ) -> None:
        self.relay, self.client, self.who, self.request_id = relay, client, who, request_id
        self.engine, self.most, self.body, self.stream = engine, most, body, stream
        self.entry = f"{relay.prefix}{next(relay.ids):x}"
        self.started = time.time_ns() // 1000

    def request_bytes(self, host: bytes) -> bytes:
        return (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Request-Id: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (
                host,
                self.request_id,
                len(self.body),
                self.body,
            )
        )

    def sent(self) -> None:
        key_id, project, team, org = self.who
        self.relay.ledger.line(
            {
                "rec": "start",
                "entry": self.entry,
                "ts_us": self.started,
                "request_id": self.request_id.decode(),
                "api_key_id": key_id,
                "project_id": project,
                "team_id": team,
                "org_id": org,
                "model": self.relay.model,
            }
        )

    def ended(self, status: int, answer: bytes | None, prompt: int, completion: int) -> None:
        relay = self.relay
        relay.in_flight[self.engine] -= 1
        relay.admitted -= 1
        cost = round(prompt * PRICE_IN + completion * PRICE_OUT)
        relay.budget_reserved -= self.most
        relay.budget_spent += cost
        key_id, project, team, org = self.who
        now = time.time_ns() // 1000
        row = (
            self.entry,
            self.request_id.decode(),
            now,
            key_id,
            project,
            team,
            org,
            relay.model,
            "openai.chat",
            prompt,
            completion,
            (now - self.started) // 1000,
            "ok" if status == 200 else "error",
            f"engine-{self.engine}",
            cost,
            status,
            "allow",
            "screen",
            "kept",
        )
        relay.ledger.line({"rec": "end", **dict(zip(COLUMNS, row))})
        relay.ledger.rows.append(row)
        relay.ledger.bodies.append((row[1], project, self.body.decode(), (answer or b"").decode(errors="replace")))

    def fail(self) -> None:
        self.relay.in_flight[self.engine] -= 1
        self.relay.admitted -= 1
        self.relay.budget_reserved -= self.most
        self.client.transport.write(_reply(503, b'{"error":{"message":"no engine"}}', self.request_id))


class Upstream(asyncio.Protocol):
    """One kept connection to an engine; a whole answer is checked and priced, a stream passed through."""

    def __init__(self, pool: list[Upstream]) -> None:
        self.pool = pool
        self.transport: Any = None
        self.call: Call | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.chunks: list[bytes] = []
        self.host = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        host, port = transport.get_extra_info("peername")[:2]
        self.host = f"{host}:{port}".encode()

    def send(self, call: Call) -> None:
        self.call = call
        self.chunks = []
        self.transport.write(call.request_bytes(self.host))
        call.sent()

    def data_received(self, data: bytes) -> None:
        call = self.call
        if call is not None and call.stream:
            call.client.transport.write(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        call, self.call = self.call, None
        self.pool.append(self)
        if call is None:
            return
        status = self.parser.get_status_code()
        answer = b"".join(self.chunks)
        if call.stream:
            call.ended(status, None, 0, 0)
            return
        prompt = completion = 0
        if status == 200:
            try:
                data = orjson.loads(answer)
                usage = data.get("usage") or {}
                prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
                changed = False
                for choice in data.get("choices") or ():
                    message = choice.get("message") or {}
                    content = message.get("content")
                    if isinstance(content, str) and EMAIL.findings(content):
                        message["content"], changed = EMAIL.pattern.sub("[email]", content), True
                if changed:
                    answer = orjson.dumps(data)
            except (ValueError, TypeError, AttributeError):
                pass
        call.ended(status, answer, prompt, completion)
        call.client.transport.write(_reply(status, answer, call.request_id))

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        if self.call is not None:
            self.call.client.transport.close()


class Downstream(asyncio.Protocol):
    """A client connection: each whole request is taken by the relay."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_begin(self) -> None:
        self.headers, self.body = {}, []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.lower(), value)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.relay.take(self, self.headers, b"".join(self.body))


async def serve(port: int, key: str, model: str, directory: Path, engine_urls: list[str]) -> None:
    engines = [(parts.hostname or "127.0.0.1", parts.port or 80) for parts in map(urlsplit, engine_urls)]
    relay = Relay(key, model, engines, Ledger(directory))
    server = await asyncio.get_running_loop().create_server(lambda: Downstream(relay), "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    if len(argv) < 5 or not argv[0].isdigit():
        sys.exit("usage: python bench/routing/governed_floor.py PORT KEY MODEL DIR ENGINE_URL...")
    directory = Path(argv[3])
    directory.mkdir(parents=True, exist_ok=True)
    uvloop.run(serve(int(argv[0]), argv[1], argv[2], directory, argv[4:]))


if __name__ == "__main__":
    main(sys.argv[1:])
