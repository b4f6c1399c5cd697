"""docs/settings.md documents every key of the settings schema, no key the schema lacks, and an example that validates."""

from __future__ import annotations

import re
from pathlib import Path

from opod.settings.schema import ClusterSettings
from opod.settings.text import parse_settings
from tests.settings.keys import keys

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
ROW = re.compile(r"^\| `([^`]+)` \|", re.M)


def documented() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    keys_part = text[text.index("## Keys") :]
    return ROW.findall(keys_part)


def test_every_key_of_the_schema_is_documented() -> None:
    missing = [key for key, _ in keys(ClusterSettings) if key not in documented()]
    assert missing == [], f"docs/settings.md has no row for {missing}; add one (type, default, meaning)"


def test_the_document_names_no_key_the_schema_lacks() -> None:
    known = {key for key, _ in keys(ClusterSettings)}
    assert [key for key in documented() if key not in known] == []


def test_every_key_has_a_description_in_the_schema() -> None:
    assert [key for key, info in keys(ClusterSettings) if not info.description] == []


def test_the_example_body_validates() -> None:
    text = DOC.read_text(encoding="utf-8")
    example = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert example is not None
    settings = parse_settings(example.group(1))
    assert settings.price("unknown-model").input_per_million == 0.5
    assert settings.budgets[0].micros == 500_000_000
