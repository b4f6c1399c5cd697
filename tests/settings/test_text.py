"""A settings body is read whole or refused whole, each problem naming its line and its field."""

from __future__ import annotations

import pytest

from opod.settings.schema import ClusterSettings, Price, duration_seconds
from opod.settings.text import SettingsInvalid, parse_settings


def problems(body: str) -> list[str]:
    with pytest.raises(SettingsInvalid) as refused:
        parse_settings(body)
    return [str(p) for p in refused.value.problems]


def test_an_empty_body_is_every_default() -> None:
    assert parse_settings("") == ClusterSettings()
    assert parse_settings("# nothing yet\n") == ClusterSettings()
    assert parse_settings("").retention.requests_days == 30


def test_a_full_body_reads_into_its_sections() -> None:
    settings = parse_settings(
        "prices:\n"
        '  "*": {input_per_million: 1, output_per_million: 2}\n'
        "  llama3.1-8b: {input_per_million: 0.25}\n"
        "budgets:\n"
        "  - {scope: org:acme, micros: 1000}\n"
        "keys: {max_lifetime: 720h, scopes: {team:acme/ml: 1h30m}}\n"
    )
    assert settings.price("llama3.1-8b") == Price(input_per_million=0.25)
    assert settings.price("other").output_per_million == 2
    assert settings.budgets[0].period == "month"
    assert settings.keys.scopes == {"team:acme/ml": "1h30m"}
    assert duration_seconds(settings.keys.scopes["team:acme/ml"]) == 5400


def test_a_wrong_period_names_its_line_and_field() -> None:
    body = (
        "prices: {}\nretention:\n  bodies: true\n\n\nbudgets:\n  - scope: org:acme\n    period: year\n    micros: 5\n"
    )
    assert problems(body) == ["line 8: budgets[0].period: must be day, week or month"]


def test_every_problem_is_named_and_nothing_is_taken() -> None:
    body = (
        "prices:\n"
        "  llama3.1-8b:\n"
        "    output_per_million: -1\n"
        "budgets:\n"
        "  - scope: team:acme/ml\n"
        "    colour: red\n"
        "keys:\n"
        "  max_lifetime: 30 days\n"
        "webhooks:\n"
        "  - url: ftp://x\n"
    )
    assert problems(body) == [
        "line 3: prices['llama3.1-8b'].output_per_million: input should be greater than or equal to 0",
        "line 5: budgets[0].micros: is required",
        "line 6: budgets[0].colour: is not a settings key here; docs/settings.md lists every key",
        "line 8: keys.max_lifetime: '30 days' is not a duration; write it like 720h, 30d, 1h30m or 90s",
        "line 10: webhooks[0].url: must start with http:// or https://",
    ]


def test_an_unknown_section_is_refused_at_its_key() -> None:
    assert problems("prices: {}\nprometheus_url: http://x\n") == [
        "line 2: prometheus_url: is not a settings key here; docs/settings.md lists every key"
    ]


def test_a_wrong_type_is_named() -> None:
    assert problems("retention:\n  requests_days: soon\n") == [
        "line 2: retention.requests_days: input should be a valid integer, unable to parse string as an integer"
    ]


def test_a_key_given_twice_is_refused() -> None:
    assert problems("prices: {}\nbudgets: []\nprices: {}\n") == ["line 3: prices: is given twice; keep one"]


def test_text_that_is_not_yaml_or_not_a_mapping_is_refused() -> None:
    [problem] = problems("prices:\n  a: [1\nbudgets: []\n")
    assert problem.startswith("line 3: not valid YAML")
    assert problems("- prices\n") == ["line 1: the body must be a mapping of settings keys, not list"]


def test_the_message_names_the_first_problems() -> None:
    with pytest.raises(SettingsInvalid, match=r"^the settings body is refused: line 2: budgets\[0\]\.period"):
        parse_settings("budgets:\n  - {scope: x, micros: 1, period: hourly}\n")


def test_scopes_are_read_by_the_parser_it_is_handed() -> None:
    from opod.access.scopes import parse_scope

    def check(text: str, kinds: tuple[str, ...], field: str) -> object:
        return parse_scope(text, kinds=kinds, field=field)

    body = (
        "budgets:\n"
        "  - {scope: org:acme, micros: 1}\n"
        "  - {scope: 'galaxy:far', micros: 1}\n"
        "retention:\n"
        "  projects:\n"
        "    org:acme: {bodies: true}\n"
        "keys:\n"
        "  scopes: {team:acme/ml: 720h}\n"
    )
    with pytest.raises(SettingsInvalid) as refused:
        parse_settings(body, check_scope=check)
    found = [str(p) for p in refused.value.problems]
    assert len(found) == 2
    assert found[0].startswith("line 3: budgets[1].scope: 'galaxy:far' starts with 'galaxy'")
    assert found[1].startswith(
        "line 6: retention.projects['org:acme']: 'org:acme' is a org scope, which is not taken here"
    )
    assert (
        parse_settings(
            body.replace("galaxy:far", "project:acme/ml/chat").replace("org:acme: {", "acme/ml/chat: {"),
            check_scope=check,
        )
        .budgets[1]
        .scope
        == "project:acme/ml/chat"
    )
