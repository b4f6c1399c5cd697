"""Measuring from outside the leader: its CPU from /proc, and the management API's latency over one kept-alive connection."""

from __future__ import annotations

import http.client
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.procs import process_tree

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds used so far by ``pid`` and its descendants (all threads)."""
    total = 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return total / TICKS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(round(q / 100 * (len(ordered) - 1))), len(ordered) - 1)]


class Api:
    """The admin listener through one kept-alive connection: what an operator's script or dashboard holds."""

    def __init__(self, base: str, key: str, timeout: float = 60.0) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.key = key
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self._conn

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, float]:
        """(status, parsed answer, seconds from sending to the whole answer read)."""
        headers = {"Authorization": f"Bearer {self.key}", "X-Llmgw-Actor": "bench"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            conn = self._connection()
            try:
                started = time.perf_counter()
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                elapsed = time.perf_counter() - started
                break
            except (http.client.HTTPException, ConnectionError):
                # The server closed an idle kept-alive connection: one new connection, then give up.
                self.close()
                if attempt:
                    raise
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return resp.status, parsed, elapsed

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, parsed, _ = self.call(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path} answered {status}: {str(parsed)[:400]}")
        return parsed

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass(frozen=True)
class Latency:
    p50: float
    p99: float
    count: int
    errors: int
