"""The usage export as CSV, read one chunk of time at a time: ``/api/v1/usage/export`` and the console's download.

The store is read one chunk of time at a time (see :mod:`opod.store.usage_report`) and each chunk's
rows are written out before the next is read, so a year of rows is never held in memory. The header
line names ``Period``, the dimensions asked for and the counts.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

from opod.control.context import ControlError
from opod.store import Store
from opod.store.offloop import run_sync
from opod.store.usage_report import DIMENSIONS, ExportTotals, chunks

COUNTS = ("Requests", "Errors", "Limited", "Prompt", "Completion", "CostMicros")
FIELD = {name: name.capitalize() for name in DIMENSIONS}
"""An export dimension → its ``store.ExportRow`` field."""


def parse_time(text: str, field: str, *, end: bool = False) -> datetime:
    """A date (``2026-09-01``) or an RFC 3339 time; a date as the end of a range includes that whole day."""
    value = text.strip()
    try:
        if len(value) == 10:
            day = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC)
            return day + timedelta(days=1) if end else day
        at = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ControlError(
            400, f"{field}: {text!r} is neither a date (2026-09-01) nor an RFC 3339 time (2026-09-01T12:00:00Z)"
        ) from None
    if at.tzinfo is None:
        raise ControlError(400, f"{field}: {text!r} has no time zone; end it with Z or an offset like +02:00")
    return at.astimezone(UTC)


def stamp(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


async def totals(
    store: Store, step: str, dims: Sequence[str], start: datetime, end: datetime
) -> AsyncIterator[list[ExportTotals]]:
    """The totals of each chunk of time from ``start`` to ``end``, read off the loop; an empty chunk yields nothing."""
    for a, b in chunks(step, start, end):
        found = await run_sync(store.usage_export_chunk, step, list(dims), a, b)
        if found:
            yield found


async def csv_lines(store: Store, step: str, dims: Sequence[str], start: datetime, end: datetime) -> AsyncIterator[str]:
    """The export as CSV text, its header first, then each chunk's rows as they are read."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["Period", *(FIELD[d] for d in dims), *COUNTS])
    yield out.getvalue()
    async for found in totals(store, step, dims, start, end):
        out.seek(0)
        out.truncate()
        writer.writerows(
            [
                stamp(r.period),
                *(r.dims[d] for d in dims),
                r.requests,
                r.errors,
                r.limited,
                r.prompt,
                r.completion,
                r.cost_micros,
            ]
            for r in found
        )
        yield out.getvalue()
