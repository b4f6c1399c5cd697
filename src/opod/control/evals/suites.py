"""Quality suites: what one says (cases, expected answers, how each is scored, a threshold), read whole or refused.

A suite is YAML (JSON is YAML too)::

    name: capitals             # optional: the file's name without its extension
    description: Capitals of Europe
    threshold: 0.8             # the score, 0 to 1, to pass at (default 0.8)
    judge: some-model          # optional: the model that grades rubric cases
    system: Answer briefly.    # optional: a system message before every case's prompt
    max_tokens: 64             # optional: each answer's cap (default 128)
    cases:
      - id: france             # optional: case-1, case-2, ... by position
        prompt: What is the capital of France?
        contains: Paris        # exactly one of: exact, contains, regex, json_schema, rubric
        weight: 1              # optional, above 0

``exact`` is the whole answer, surrounding whitespace aside; ``contains`` a text the answer holds,
in any case; ``regex`` a pattern found in it (Python's ``re.search``); ``json_schema`` a JSON
schema the first JSON value of the answer must satisfy; ``rubric`` what a judge model is asked
to grade the answer against. A suite with any fault is refused whole, the error naming the file,
the case and the field, and nothing of it is run.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from opod.store.errors import InvalidInput

KINDS = ("exact", "contains", "regex", "json_schema", "rubric")
SUITE_KEYS = frozenset({"name", "description", "threshold", "judge", "system", "max_tokens", "cases"})
CASE_KEYS = frozenset({"id", "prompt", "weight", "system", "max_tokens", *KINDS})
DEFAULT_THRESHOLD = 0.8
DEFAULT_MAX_TOKENS = 128
MAX_TOKENS_CAP = 8192
MAX_CASES = 1000
MAX_SUITE_BYTES = 1 << 20
SUFFIXES = (".yaml", ".yml", ".json")
BUILT_IN = "built in"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class SuiteError(InvalidInput):
    """A suite that cannot be run; the message names where it came from, the case and the field."""


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    prompt: str
    kind: str
    """How its answer is scored: one of :data:`KINDS`."""
    expected: str
    """The expected text, the pattern, the schema as JSON text, or the rubric."""
    weight: float = 1.0
    system: str = ""
    max_tokens: int = DEFAULT_MAX_TOKENS


@dataclass(frozen=True, slots=True)
class Suite:
    name: str
    source: str
    """The file it was read from, ``built in``, or what a request named."""
    description: str
    threshold: float
    judge: str
    cases: tuple[Case, ...]
    hash: str
    """The sha256 of its text."""

    @property
    def judged(self) -> bool:
        """True when some case is graded by a judge model."""
        return any(c.kind == "rubric" for c in self.cases)


@dataclass(frozen=True, slots=True)
class BrokenSuite:
    """A file of the eval directory that cannot be run, and why."""

    name: str
    source: str
    error: str


class _Where:
    """Names the place of a fault: the suite's source, then the case, then the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fault(self, field: str, why: str, case: str = "") -> SuiteError:
        where = f"suite {self.source}"
        if case:
            where += f": case {case}"
        return SuiteError(f"{where}: {field}: {why}")


def _text(value: Any, field: str, where: _Where, case: str = "", *, empty: bool = False) -> str:
    if value is None and empty:
        return ""
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise where.fault(field, f"{value!r} is not text; give a non-empty string", case)
    return value


def _number(value: Any, field: str, where: _Where, case: str, low: float, high: float | None) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"from {low:g} to {high:g}" if high is not None else f"above {low:g}"
        raise where.fault(field, f"{value!r} is not a number {bound}", case)
    return float(value)


def _tokens(value: Any, field: str, where: _Where, case: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS_CAP:
        raise where.fault(field, f"{value!r} is not a whole number from 1 to {MAX_TOKENS_CAP}", case)
    return value


def _unknown(keys: set[str], allowed: frozenset[str], where: _Where, case: str = "") -> None:
    extra = sorted(str(k) for k in keys - allowed)
    if extra:
        raise where.fault(
            extra[0], f"not a field of a {'case' if case else 'suite'}; known: {', '.join(sorted(allowed))}", case
        )


def _expected(kind: str, value: Any, where: _Where, case: str) -> str:
    if kind == "json_schema":
        from jsonschema import exceptions as schema_errors  # here, not at the leader's start: slow to import
        from jsonschema import validators

        schema = value
        if isinstance(value, str):
            try:
                schema = json.loads(value)
            except ValueError as err:
                raise where.fault(kind, f"not JSON: {err}", case) from None
        if not isinstance(schema, dict | bool):
            raise where.fault(kind, "a JSON schema is an object (or true/false)", case)
        try:
            validators.validator_for(schema).check_schema(schema)
        except schema_errors.SchemaError as err:
            raise where.fault(kind, f"not a valid JSON schema: {err.message}", case) from None
        return json.dumps(schema, sort_keys=True)
    text = _text(
        value if not isinstance(value, int | float) or isinstance(value, bool) else str(value), kind, where, case
    )
    if kind == "regex":
        try:
            re.compile(text)
        except re.error as err:
            raise where.fault(kind, f"{text!r} is not a regular expression: {err}", case) from None
    return text


def _case(raw: Any, index: int, defaults: tuple[str, int], where: _Where, seen: set[str]) -> Case:
    label = f"cases[{index}]"
    if not isinstance(raw, dict):
        raise where.fault(label, "a case is a mapping with a prompt and one way to score it")
    case_id = raw.get("id", f"case-{index + 1}")
    if isinstance(case_id, int) and not isinstance(case_id, bool):
        case_id = str(case_id)
    case_id = _text(case_id, "id", where, label)
    label = f"{case_id!r} ({label})"
    if case_id in seen:
        raise where.fault("id", "another case has this id; give each case its own", label)
    seen.add(case_id)
    _unknown(set(raw), CASE_KEYS, where, label)
    kinds = [k for k in KINDS if k in raw]
    if len(kinds) != 1:
        found = f"it has {', '.join(kinds)}" if kinds else "it has none"
        raise where.fault("scoring", f"give exactly one of {', '.join(KINDS)} ({found})", label)
    kind = kinds[0]
    return Case(
        id=case_id,
        prompt=_text(raw.get("prompt"), "prompt", where, label),
        kind=kind,
        expected=_expected(kind, raw[kind], where, label),
        weight=_number(raw.get("weight", 1), "weight", where, label, 0, None) or _zero_weight(where, label),
        system=_text(raw.get("system", defaults[0]), "system", where, label, empty=True),
        max_tokens=_tokens(raw.get("max_tokens", defaults[1]), "max_tokens", where, label),
    )


def _zero_weight(where: _Where, case: str) -> float:
    raise where.fault("weight", "0 weighs nothing; give a number above 0 or remove the case", case)


def parse_suite(text: str, source: str, default_name: str) -> Suite:
    """The suite ``text`` says, read from ``source`` (named ``default_name`` unless it names itself); SuiteError
    naming the source, the case and the field otherwise."""
    where = _Where(source)
    if len(text.encode()) > MAX_SUITE_BYTES:
        raise where.fault("text", f"over {MAX_SUITE_BYTES // 1024} KiB; split it into several suites")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise where.fault("text", f"not YAML{at}: {getattr(err, 'problem', None) or err}") from None
    if not isinstance(raw, dict):
        raise where.fault("text", "a suite is a mapping with cases (see GET /api/v1/eval/suites for the built-in ones)")
    _unknown(set(raw), SUITE_KEYS, where)
    name = _text(raw.get("name", default_name), "name", where)
    if not NAME.match(name):
        raise where.fault(
            "name", f"{name!r}: use letters, digits, '.', '_' and '-' (up to 64), starting with a letter or digit"
        )
    cases_raw = raw.get("cases")
    if not isinstance(cases_raw, list) or not cases_raw:
        raise where.fault("cases", "a suite needs a list of at least one case")
    if len(cases_raw) > MAX_CASES:
        raise where.fault("cases", f"{len(cases_raw)} cases; at most {MAX_CASES} in one suite")
    defaults = (
        _text(raw.get("system", ""), "system", where, empty=True),
        _tokens(raw.get("max_tokens", DEFAULT_MAX_TOKENS), "max_tokens", where),
    )
    seen: set[str] = set()
    cases = tuple(_case(c, i, defaults, where, seen) for i, c in enumerate(cases_raw))
    judge = _text(raw.get("judge", ""), "judge", where, empty=True)
    return Suite(
        name=name,
        source=source,
        description=_text(raw.get("description", ""), "description", where, empty=True),
        threshold=_number(raw.get("threshold", DEFAULT_THRESHOLD), "threshold", where, "", 0, 1),
        judge=judge,
        cases=cases,
        hash=hashlib.sha256(text.encode()).hexdigest(),
    )


def read_dir(directory: Path, taken: frozenset[str]) -> tuple[list[Suite], list[BrokenSuite]]:
    """The suites of ``directory`` (sorted by file name) and the files that cannot be run; a name in ``taken`` (the
    built-in suites) or used by an earlier file is refused. A directory that does not exist holds none."""
    suites: list[Suite] = []
    broken: list[BrokenSuite] = []
    if not directory.is_dir():
        return suites, broken
    names = set(taken)
    for path in sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES and p.is_file()):
        try:
            suite = parse_suite(path.read_text(encoding="utf-8"), str(path), path.stem)
        except (OSError, UnicodeDecodeError) as err:
            broken.append(BrokenSuite(path.stem, str(path), f"suite {path}: cannot be read: {err}"))
            continue
        except SuiteError as err:
            broken.append(BrokenSuite(path.stem, str(path), str(err)))
            continue
        if suite.name in names:
            why = "a built-in suite's" if suite.name in taken else "an earlier file's"
            broken.append(
                BrokenSuite(suite.name, str(path), f"suite {path}: name: {suite.name!r} is {why}; give it another name")
            )
            continue
        names.add(suite.name)
        suites.append(suite)
    return suites, broken
