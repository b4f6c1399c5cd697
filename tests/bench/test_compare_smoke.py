"""``python -m bench compare`` at its smallest: two simulator workers, one short round of every measurement.

Every path it compares by default runs: direct, opod with every governance area on (set up through ``opod ctl``, its
guardrail the settings' guard policy, checked on one request's record), the bare Python relay (a yardstick) and
sglang-router, installed into its own virtual environment on first use (about 15 s). The path asked for,
``opod-webhook`` (the policy file's guardrail webhook in place of the guard policy), runs beside opod on one leader.
"""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import by_measure, md_table, number, run_bench

PATHS = ("direct", "opod", "relay-floor", "governed-floor", "sglang-router")
SMALLEST = (
    *("--workers", "2", "--rounds", "1", "--seconds", "0.5", "--capacity-level", "16"),
    *("--capacity-seconds", "0.5", "--open-seconds", "0.5", "--zero-level", "8", "--zero-seconds", "0.5"),
    *("--zero-rounds", "1"),
)


def test_every_path_answers_every_measurement_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench("compare", *SMALLEST, "--results", str(results), "--name", "smoke", timeout=300)
    text = (results / "smoke.md").read_text()
    assert "`python -m bench compare --workers 2" in text and "on commit `" in text
    table = by_measure(md_table(text, "measure"))
    for path in PATHS:
        assert table["status"][path] == "ran", (path, table["status"][path])
        answered, failed = (number(part) for part in table["requests answered / failed (every phase)"][path].split("/"))
        assert answered > 0 and failed == 0, (path, answered, failed)
        saturation = next(v for k, v in table.items() if k.startswith("saturation req/s"))
        assert number(saturation[path]) > 0, path
        for measure, row in table.items():
            if measure.startswith(("chat", "streamed")):
                number(row[path])  # every latency cell measured (a dash would be a path that answered nothing)
    cpu = next(v for k, v in table.items() if k.startswith("the router's CPU ms per request"))
    # Read from /proc in clock ticks (10 ms): a few requests of a light router may cost none, but it is measured.
    assert all(number(cpu[path]) >= 0 for path in PATHS[1:]) and cpu["direct"] == "—"
    wait = next(v for k, v in table.items() if k.startswith("the router's wait for a core"))
    assert all(number(wait[path]) >= 0 for path in PATHS[1:]) and wait["direct"] == "—"
    # At saturation too, over the best level's measured window: opod's leader cannot answer a few hundred chats free.
    saturated = table["the router's CPU ms per request at saturation (its own processes, at the best concurrency)"]
    assert all(number(saturated[path]) >= 0 for path in PATHS[1:]) and saturated["direct"] == "—"
    assert number(saturated["opod"]) > 0
    # opod's guardrail is the settings' guard policy, run in the leader, checked on a request's record on both fleets.
    assert text.count("opod: governance checked on the") == 2, text
    assert text.count("guard policy screen allow") == 2 and text.count("body kept") == 2
    # How the leader ran, as its own log said: its heap, and where its event loop was (pinned, or free and why).
    assert text.count("opod: the leader of the") == 2 and text.count("event loop ") >= 2, text
    assert text.count("'s workers and engines: workers on CPUs ") == 2 and ", engines on CPUs " in text, text
    assert "opod-webhook" not in text and "`bench/webhook.py`" not in text  # the webhook path is asked for, not default
    assert "| what ran |" in text and "guardrail: guard policy in process" in text
    assert sorted(p.name for p in results.glob("smoke-*.png")) == [
        "smoke-added.png",
        "smoke-open-loop-cdf.png",
        "smoke-saturation.png",
    ]


def test_opod_webhook_runs_beside_opod_each_with_its_own_guardrail(tmp_path: Path) -> None:
    """Both governed paths on one leader: each turn puts the path's own guardrail in force, and each check's record
    names the one that allowed it (the webhook's alone, so the guard policy was out of force then)."""
    results = tmp_path / "results"
    paths = ("--path", "opod", "--path", "opod-webhook")
    run_bench("compare", *SMALLEST, *paths, "--results", str(results), "--name", "smoke", timeout=300)
    text = (results / "smoke.md").read_text()
    table = by_measure(md_table(text, "measure"))
    assert list(table["status"])[1:] == ["direct", "opod", "opod-webhook"]
    for path in ("opod", "opod-webhook"):
        assert table["status"][path] == "ran", (path, table["status"][path])
        answered, failed = (number(part) for part in table["requests answered / failed (every phase)"][path].split("/"))
        assert answered > 0 and failed == 0, (path, answered, failed)
    assert "guardrail: policy-file webhook" in table["what ran"]["opod-webhook"]
    assert text.count("opod: governance checked on the") == 2 and text.count("guard policy screen allow") == 2
    assert text.count("opod-webhook: governance checked on the") == 2
    assert text.count("guardrail webhook screen-webhook allow") == 2
    assert "share the latency fleet's leader, so each of their turns began by putting its own guardrail" in text
    assert "**opod and opod-webhook share the fleet's leader**" in text
    assert text.startswith("# opod compared with direct and opod with a policy-file guardrail webhook (")
    assert "bare Python relay" not in text and "sglang-router" not in text  # not asked for, not described
