"""The management API's tests: fixtures and collection shared by the files of this folder."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # schemathesis names each operation's test ``test_x[GET /path]`` but gives every one the nodeid
    # ``test_x`` on pytest 9 (it sets the attribute older pytest read); pytest-xdist schedules by
    # nodeid and would run one operation of them all. Each gets the nodeid its name says.
    for item in items:
        if (
            type(item).__name__ == "SchemathesisFunction"
            and item.parent is not None
            and item.nodeid.rsplit("::", 1)[-1] != item.name
        ):
            item._id = item.parent.id.child(item.name)
