"""The environment contract table (CONTRACT.md §3.4)."""

from __future__ import annotations

import re

from opod.contract import env
from opod.contract.adminapi import Side
from opod.contract.features import FEATURE_KEYS


def test_rows_are_unique_well_formed_and_complete() -> None:
    rows = env.env()
    assert len(rows) == 25
    names = [r.name for r in rows]
    assert len(set(names)) == len(names)
    sides = [r.side for r in rows]
    assert (sides.count("leader"), sides.count("worker"), sides.count("both")) == (5, 12, 8)
    for row in rows:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", row.name)
        assert row.side in {s.value for s in Side}
        assert row.doc.strip()
        assert re.fullmatch(r"|[a-z][a-z0-9_]*|v\d+\.\d+\.\d+", row.since)
        assert not re.fullmatch(r"[a-z][a-z0-9_]*", row.since) or row.since in FEATURE_KEYS


def test_every_env_constant_is_a_row_and_every_row_a_constant() -> None:
    constants = {v for k, v in vars(env).items() if k.startswith("ENV_") and isinstance(v, str)}
    assert constants == {r.name for r in env.env()}
    retired = {v for k, v in vars(env).items() if k.startswith("RETIRED_ENV_") and isinstance(v, str)}
    assert retired == {r.name for r in env.retired()}


def test_retired_rows() -> None:
    rows = env.retired()
    assert [r.name for r in rows] == ["OPOD_UI", "OPOD_EGRESS", "OPOD_CALLBACKS"]
    for row in rows:
        assert re.fullmatch(r"v\d+\.\d+\.\d+", row.retired_in) and row.note.strip()
        assert env.lookup(row.name) is None
    assert env.lookup("OPOD_PROTOCOLS") is None and env.lookup_retired("OPOD_PROTOCOLS") is None


def test_tables_are_copies() -> None:
    rows = env.env()
    rows[0].name = "CHANGED"
    rows.clear()
    assert env.env()[0].name == "OPOD_PLAN_FILE"
    assert env.lookup("OPOD_PLAN_FILE") is not None
    env.retired().clear()
    assert len(env.retired()) == 3


def test_lookups() -> None:
    ca = env.lookup("OPOD_LEADER_CA")
    assert ca is not None and ca.side == "worker" and ca.since == "tls_listener"
    assert env.lookup("OPOD_NO_SUCH_VARIABLE") is None
    ui = env.lookup_retired("OPOD_UI")
    assert ui is not None and ui.retired_in
    assert env.lookup("HF_TOKEN").side == "both"


def test_rows_encode_with_since_omitted_when_empty() -> None:
    assert "since" not in env.lookup("HF_TOKEN").to_wire()
    assert env.lookup("OPOD_ADAPTERS").to_wire()["since"] == "lora"
