"""The suites every leader carries: ``arithmetic`` and ``json-format``, read by the same parser as a file's."""

from __future__ import annotations

import functools

from opod.control.evals.suites import BUILT_IN, Suite, parse_suite

_NUMBER_ONLY = "Answer with the number only."

ARITHMETIC = f"""\
name: arithmetic
description: Small sums, differences and products; the answer is the number alone.
threshold: 0.8
max_tokens: 16
system: You are a calculator. {_NUMBER_ONLY}
cases:
  - id: add
    prompt: What is 17 + 25? {_NUMBER_ONLY}
    regex: '^\\s*42\\s*\\.?\\s*$'
  - id: subtract
    prompt: What is 100 - 37? {_NUMBER_ONLY}
    regex: '^\\s*63\\s*\\.?\\s*$'
  - id: multiply
    prompt: What is 12 * 12? {_NUMBER_ONLY}
    regex: '^\\s*144\\s*\\.?\\s*$'
  - id: divide
    prompt: What is 81 / 9? {_NUMBER_ONLY}
    regex: '^\\s*9\\s*\\.?\\s*$'
  - id: order
    prompt: What is 2 + 3 * 4? {_NUMBER_ONLY}
    regex: '^\\s*14\\s*\\.?\\s*$'
  - id: negative
    prompt: What is 5 - 12? {_NUMBER_ONLY}
    regex: '^\\s*-\\s*7\\s*\\.?\\s*$'
"""

JSON_FORMAT = """\
name: json-format
description: Answers that must be one JSON value of a given shape, and nothing else.
threshold: 0.75
max_tokens: 96
system: Reply with JSON only, no prose and no code fences.
cases:
  - id: person
    prompt: 'Give a JSON object with "name" (a string) and "age" (an integer) for Ada, aged 36.'
    json_schema:
      type: object
      required: [name, age]
      properties:
        name: {type: string}
        age: {type: integer}
  - id: list
    prompt: Give a JSON array of the first three prime numbers.
    json_schema:
      type: array
      minItems: 3
      maxItems: 3
      items: {type: integer}
  - id: flag
    prompt: 'Give a JSON object with one key "ok" whose value is the boolean true.'
    json_schema:
      type: object
      required: [ok]
      properties:
        ok: {const: true}
  - id: nested
    prompt: 'Give a JSON object with "city" (a string) and "point", an object of two numbers "lat" and "lon", for Paris.'
    json_schema:
      type: object
      required: [city, point]
      properties:
        city: {type: string}
        point:
          type: object
          required: [lat, lon]
          properties:
            lat: {type: number}
            lon: {type: number}
"""


@functools.cache
def built_in_suites() -> dict[str, Suite]:
    """The built-in suites by name, read at first use rather than at the leader's start: json-format's schemas are
    checked with jsonschema, which is slow to import."""
    return {s.name: s for s in (parse_suite(text, BUILT_IN, "") for text in (ARITHMETIC, JSON_FORMAT))}
