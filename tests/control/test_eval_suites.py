"""Quality suites read whole or refused with the file, the case and the field named; answers scored by each kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opod.control.evals.builtin import built_in_suites
from opod.control.evals.scoring import read_grade, score
from opod.control.evals.suites import Case, SuiteError, parse_suite, read_dir


def refusal(text: str, source: str = "/evals/s.yaml") -> str:
    with pytest.raises(SuiteError) as caught:
        parse_suite(text, source, "s")
    return str(caught.value)


def test_a_suite_reads_with_its_defaults_and_its_hash() -> None:
    suite = parse_suite(
        "system: Be brief.\nmax_tokens: 32\ncases:\n  - prompt: hi\n    exact: 42\n  - id: b\n    prompt: x\n"
        "    contains: Paris\n    weight: 2\n    max_tokens: 8\n",
        "/evals/mine.yaml",
        "mine",
    )
    assert suite.name == "mine" and suite.threshold == 0.8 and suite.source == "/evals/mine.yaml"
    first, second = suite.cases
    assert (first.id, first.kind, first.expected, first.system, first.max_tokens) == (
        "case-1",
        "exact",
        "42",
        "Be brief.",
        32,
    )
    assert (second.id, second.weight, second.max_tokens) == ("b", 2.0, 8)
    assert len(suite.hash) == 64 and not suite.judged


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("cases: [", "suite /evals/s.yaml: text: not YAML at line"),
        ("- a\n- b\n", "suite /evals/s.yaml: text: a suite is a mapping"),
        ("cases: []\n", "suite /evals/s.yaml: cases: a suite needs a list of at least one case"),
        ("cases:\n  - prompt: a\n    exact: b\ncolour: red\n", "suite /evals/s.yaml: colour: not a field of a suite"),
        ("threshold: 2\ncases:\n  - prompt: a\n    exact: b\n", "threshold: 2 is not a number from 0 to 1"),
        ("cases:\n  - prompt: a\n", "case 'case-1' (cases[0]): scoring: give exactly one of exact, contains, regex"),
        ("cases:\n  - prompt: a\n    exact: b\n    regex: c\n", "it has exact, regex"),
        ("cases:\n  - exact: b\n", "case 'case-1' (cases[0]): prompt: None is not text"),
        (
            "cases:\n  - id: r\n    prompt: a\n    regex: '(x'\n",
            "case 'r' (cases[0]): regex: '(x' is not a regular expression",
        ),
        (
            "cases:\n  - id: j\n    prompt: a\n    json_schema: {type: nope}\n",
            "case 'j' (cases[0]): json_schema: not a valid JSON schema",
        ),
        (
            "cases:\n  - id: w\n    prompt: a\n    exact: b\n    weight: 0\n",
            "case 'w' (cases[0]): weight: 0 weighs nothing",
        ),
        (
            "cases:\n  - {id: a, prompt: x, exact: y}\n  - {id: a, prompt: x, exact: y}\n",
            "case 'a' (cases[1]): id: another case",
        ),
        ("cases:\n  - {prompt: x, exact: y, tone: z}\n", "case 'case-1' (cases[0]): tone: not a field of a case"),
        ("name: 'bad name'\ncases:\n  - {prompt: x, exact: y}\n", "name: 'bad name': use letters"),
    ],
)
def test_a_bad_suite_is_refused_naming_the_file_the_case_and_the_field(text: str, said: str) -> None:
    message = refusal(text)
    assert said in message and message.startswith("suite /evals/s.yaml")


def test_the_directory_lists_good_suites_and_broken_files_never_half_loaded(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("cases:\n  - {prompt: x, contains: y}\n")
    (tmp_path / "b.json").write_text(json.dumps({"name": "arithmetic", "cases": [{"prompt": "x", "exact": "y"}]}))
    (tmp_path / "c.yml").write_text("cases:\n  - {prompt: x, contains: y}\n  - {prompt: x}\n")
    (tmp_path / "d.yaml").write_text("name: a\ncases:\n  - {prompt: x, contains: y}\n")
    (tmp_path / "notes.txt").write_text("not a suite")
    suites, broken = read_dir(tmp_path, frozenset(built_in_suites()))
    assert [s.name for s in suites] == ["a"]
    why = {b.source.rsplit("/", 1)[1]: b.error for b in broken}
    assert set(why) == {"b.json", "c.yml", "d.yaml"}
    assert "'arithmetic' is a built-in suite's" in why["b.json"]
    assert "c.yml: case 'case-2' (cases[1]): scoring" in why["c.yml"]
    assert "'a' is an earlier file's" in why["d.yaml"]
    assert read_dir(tmp_path / "absent", frozenset()) == ([], [])


def case(kind: str, expected: str) -> Case:
    return Case(id="c", prompt="p", kind=kind, expected=expected)


@pytest.mark.parametrize(
    ("kind", "expected", "answer", "passed", "detail"),
    [
        ("exact", "42", " 42\n", True, "is exactly '42'"),
        ("exact", "42", "42.", False, "expected exactly '42'"),
        ("contains", "paris", "It is Paris.", True, "contains 'paris'"),
        ("contains", "Rome", "It is Paris.", False, "does not contain 'Rome'"),
        ("regex", r"^\s*-\s*7$", " -7", True, r"matches /^\s*-\s*7$/"),
        ("regex", r"^\d+$", "seven", False, r"does not match /^\d+$/"),
        (
            "json_schema",
            '{"type": "array", "items": {"type": "integer"}}',
            "Sure: ```json\n[2, 3, 5]\n```",
            True,
            "its JSON satisfies",
        ),
        ("json_schema", '{"type": "object", "required": ["a"]}', '{"b": 1}', False, "$: 'a' is a required property"),
        ("json_schema", '{"type": "object"}', "no json here", False, "no JSON object or array in the answer"),
        (
            "json_schema",
            '{"type": "array", "items": {"type": "integer"}}',
            '[1, "x"]',
            False,
            "$[1]: 'x' is not of type 'integer'",
        ),
    ],
)
def test_each_kind_scores_an_answer_and_says_why(
    kind: str, expected: str, answer: str, passed: bool, detail: str
) -> None:
    verdict = score(case(kind, expected), answer)
    assert verdict.passed is passed and verdict.score == (1.0 if passed else 0.0)
    assert verdict.detail.startswith(detail)


def test_a_judge_s_grade_is_read_from_its_reply() -> None:
    graded = read_grade("8/10\nIt names the capital but not the country.")
    assert graded is not None and graded.score == 0.8 and graded.passed
    assert graded.detail == "the judge gave 8/10: 'It names the capital but not the country.'"
    assert [getattr(read_grade(reply), "score", None) for reply in ("3", "10", "I cannot grade this.")] == [
        0.3,
        1.0,
        None,
    ]


def test_the_built_in_suites_hold_what_they_say() -> None:
    arithmetic, formats = built_in_suites()["arithmetic"], built_in_suites()["json-format"]
    assert arithmetic.source == formats.source == "built in"
    assert all(c.kind == "regex" for c in arithmetic.cases)
    assert score(arithmetic.cases[0], "42").passed and not score(arithmetic.cases[0], "41").passed
    assert score(arithmetic.cases[5], "-7").passed
    assert all(c.kind == "json_schema" for c in formats.cases)
    assert score(formats.cases[0], '{"name": "Ada", "age": 36}').passed
    assert not score(formats.cases[0], '{"name": "Ada", "age": "36"}').passed
