"""FetchMeter: a fetch's progress callback that a person can read, a line per tenth with the rate."""

from __future__ import annotations

from opod.weights.progress import FetchMeter, size_text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sizes_read_as_download_pages_write_them() -> None:
    assert [size_text(n) for n in (512, 1_500, 270_000_000, 1_300_000_000, 12_000_000)] == [
        "512 B",
        "1.5 kB",
        "270 MB",
        "1.3 GB",
        "12.0 MB",
    ]


def test_a_line_at_each_tenth_with_the_total_and_the_rate() -> None:
    clock, lines = Clock(), []
    meter = FetchMeter("m: fetching", say=lines.append, clock=clock)
    total = 100_000_000
    for done in range(0, total + 1, 1_000_000):  # a hundred chunks
        meter(done, total)
        clock.now += 0.1
    assert len(lines) == 11, lines
    assert lines[0] == "m: fetching: 0% of 100 MB (0 B)"
    assert lines[5].startswith("m: fetching: 50% of 100 MB (50.0 MB, 10.0 MB/s)"), lines[5]
    assert lines[-1].startswith("m: fetching: 100% of 100 MB (100 MB, ")


def test_a_resumed_fetch_counts_only_new_bytes_and_no_total_reports_every_ten_seconds() -> None:
    clock, lines = Clock(), []
    meter = FetchMeter("m", say=lines.append, clock=clock)
    meter(60_000_000, 100_000_000)
    clock.now += 4
    meter(80_000_000, 100_000_000)
    assert meter.rate == 5_000_000 and lines == ["m: 60% of 100 MB (60.0 MB)", "m: 80% of 100 MB (80.0 MB, 5.0 MB/s)"]
    unsized = FetchMeter("u", say=(said := []).append, clock=clock)
    for _ in range(30):
        unsized(1_000, None)
        clock.now += 1
    assert len(said) == 3 and said[0] == "u: 1.0 kB"
    assert FetchMeter("q").describe() == "q: 0 B"
