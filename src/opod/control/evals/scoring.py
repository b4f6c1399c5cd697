"""How an answer scores against its case: exact, contains, regex and JSON schema here; a rubric by a judge model.

Each verdict is a score from 0 to 1, passed from 0.5 up, and a detail that says why in words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from opod.control.evals.suites import Case

PASS_AT = 0.5
"""A case scoring under half is ``below`` (the spec's word); at half or more it passed."""
SHOWN = 80
GRADE = re.compile(r"(?<![\d.])(10|[0-9])(?:\s*/\s*10)?(?![\d.])")


@dataclass(frozen=True, slots=True)
class Verdict:
    score: float
    detail: str

    @property
    def passed(self) -> bool:
        return self.score >= PASS_AT


def _shown(text: str) -> str:
    return repr(text if len(text) <= SHOWN else text[:SHOWN] + "…")


def first_json(answer: str) -> tuple[object, bool]:
    """The first JSON value in ``answer`` (prose or a code fence around it allowed); ``(None, False)`` when none."""
    decoder = json.JSONDecoder()
    for at, char in enumerate(answer):
        if char in "{[":
            try:
                return decoder.raw_decode(answer, at)[0], True
            except ValueError:
                continue
    return None, False


def score(case: Case, answer: str) -> Verdict:
    """The verdict of an answer to a case scored without a judge (every kind but ``rubric``)."""
    if case.kind == "exact":
        if answer.strip() == case.expected.strip():
            return Verdict(1.0, f"is exactly {_shown(case.expected.strip())}")
        return Verdict(0.0, f"expected exactly {_shown(case.expected.strip())}")
    if case.kind == "contains":
        if case.expected.casefold() in answer.casefold():
            return Verdict(1.0, f"contains {_shown(case.expected)}")
        return Verdict(0.0, f"does not contain {_shown(case.expected)}")
    if case.kind == "regex":
        if re.search(case.expected, answer):
            return Verdict(1.0, f"matches /{case.expected}/")
        return Verdict(0.0, f"does not match /{case.expected}/")
    if case.kind == "json_schema":
        return _schema(case, answer)
    raise ValueError(f"a {case.kind} case is graded by a judge model, not scored here")


def _schema(case: Case, answer: str) -> Verdict:
    from jsonschema import validators  # here, not at the leader's start: slow to import

    value, found = first_json(answer)
    if not found:
        return Verdict(0.0, "no JSON object or array in the answer")
    schema = json.loads(case.expected)
    validator = validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if not errors:
        return Verdict(1.0, "its JSON satisfies the schema")
    first = errors[0]
    where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return Verdict(0.0, f"{where}: {first.message}{more}")


def judge_prompt(case: Case, answer: str) -> str:
    """What the judge model is asked: the question, the rubric and the answer, and a grade from 0 to 10 back."""
    return (
        "You grade an answer to a question against a rubric.\n\n"
        f"Question:\n{case.prompt}\n\nRubric:\n{case.expected}\n\nAnswer:\n{answer}\n\n"
        "Reply with one whole number from 0 (fails the rubric entirely) to 10 (meets it fully) on the first line, "
        "then one sentence saying why."
    )


def read_grade(reply: str) -> Verdict | None:
    """The judge's grade as a verdict (the grade over 10); ``None`` when its reply holds no grade."""
    found = GRADE.search(reply)
    if found is None:
        return None
    grade = int(found.group(1))
    why = reply.strip().splitlines()[1:] or [""]
    reason = " ".join(line.strip() for line in why).strip()
    return Verdict(grade / 10, f"the judge gave {grade}/10" + (f": {_shown(reason)}" if reason else ""))
