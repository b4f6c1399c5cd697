"""Plan flags and launch specs: what is accepted, and what each refusal says."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opod.engines import flags as fl
from opod.engines.base import LaunchSpec
from opod.engines.errors import LaunchError


def test_numbers_accept_json_numbers_and_digit_strings() -> None:
    assert fl.int_flag({"ctx": 4096}, "ctx") == 4096
    assert fl.int_flag({"ctx": "4096"}, "ctx") == 4096
    assert fl.int_flag({"ctx": 4096.0}, "ctx") == 4096
    assert fl.int_flag({}, "ctx") is None
    for bad in (True, "4k", 4096.5, -1, [1]):
        with pytest.raises(LaunchError) as err:
            fl.int_flag({"ctx": bad}, "ctx")
        assert err.value.field == "flags.ctx" and "whole number" in err.value.reason and "remove it" in err.value.remedy


def test_words_lists_and_booleans() -> None:
    assert fl.str_flag({"d": "bf16"}, "d") == "bf16"
    assert fl.list_flag({"r": "a:1,b:2"}, "r") == ["a:1", "b:2"]
    assert fl.list_flag({"r": [0.5, 0.5]}, "r") == ["0.5", "0.5"]
    assert fl.bool_flag({"e": True}, "e") is True
    with pytest.raises(LaunchError, match="flags.e: 'yes' is not true or false"):
        fl.bool_flag({"e": "yes"}, "e")
    with pytest.raises(LaunchError, match=r"flags.r\[1\]"):
        fl.list_flag({"r": ["a:1", "-x"]}, "r")
    with pytest.raises(LaunchError, match="would read as a flag"):
        fl.str_flag({"d": "--all"}, "d")


def test_extra_accepts_plain_flags_values_and_negative_numbers() -> None:
    extra = ["--temp", "0.5", "--offset", "-3", "--json", '{"a": [1, 2]}', "-fa", "--x=y", 7]
    assert fl.extra_args({"extra": extra}) == [
        "--temp",
        "0.5",
        "--offset",
        "-3",
        "--json",
        '{"a": [1, 2]}',
        "-fa",
        "--x=y",
        "7",
    ]
    assert fl.extra_args({}) == []


@pytest.mark.parametrize(
    ("extra", "field", "reason"),
    [
        (["--a", "b && c"], "flags.extra[1]", "shell syntax '&'"),
        (["--a", "`id`"], "flags.extra[1]", "shell syntax '`'"),
        (["--a", "x > /etc/passwd"], "flags.extra[1]", "shell syntax '>'"),
        (["--a", "${HOME}"], "flags.extra[1]", "shell syntax '${'"),
        (["--a", "line\x00"], "flags.extra[1]", "control character"),
        (["--a b"], "flags.extra[0]", "is not a flag"),
        (["--a", ""], "flags.extra[1]", "is empty"),
        (["--a", None], "flags.extra[1]", "not a string or number"),
        (["--model", "other"], "flags.extra[0]", "set by opod itself"),
        ({"--a": "b"}, "flags.extra", "not a list"),
    ],
)
def test_extra_refusals_name_the_item(extra: object, field: str, reason: str) -> None:
    with pytest.raises(LaunchError) as err:
        fl.extra_args({"extra": extra}, reserved=frozenset({"--model"}))
    assert err.value.field == field and reason in err.value.reason
    assert str(err.value).startswith(f"{field}: ")


def test_spec_checks() -> None:
    ok = LaunchSpec(model_id="m", model="/w/m.gguf", port=8000)
    fl.check_spec(ok)
    for change, field in (
        ({"port": 70000}, "spec.port"),
        ({"host": ""}, "spec.host"),
        ({"context": -1}, "spec.context"),
        ({"parallel": True}, "spec.parallel"),
        ({"model": "a\nb"}, "spec.model"),
        ({"launcher": ("python", "")}, "spec.launcher[1]"),
    ):
        with pytest.raises(LaunchError, match=field.replace("[", r"\[").replace("]", r"\]")):
            fl.check_spec(replace(ok, **change))
