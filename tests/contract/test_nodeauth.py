"""The X-Opod-Auth signature: the check vector, the time window, and a reason for every refusal."""

from __future__ import annotations

import pytest

from opod.contract.nodeauth import AuthRefused, Refusal, parse_header, sign, signature, verify

TOKEN = "node-token-example"
TS = 1789732800
SIG = "1cd91f6acd89535041c368ca7ed46f6fa8511be3b70e8c7ab1aee053e87331ce"
PATH = "/admin/v1/nodes/heartbeat"


def test_the_check_vector() -> None:
    assert signature(TOKEN, "POST", PATH, TS) == SIG
    assert signature(TOKEN, "post", PATH + "?x=1", str(TS)) == SIG
    assert sign("n_w0", TOKEN, "POST", PATH, now=TS) == f"v=1,id=n_w0,ts={TS},sig={SIG}"


def test_a_good_signature_verifies_inside_the_window() -> None:
    header = sign("n_w0", TOKEN, "POST", PATH, now=TS)
    assert verify(header, "POST", PATH, TOKEN, now=TS + 299).node_id == "n_w0"
    assert verify(
        header, "POST", PATH + "?after=3", lambda node: TOKEN if node == "n_w0" else None, now=TS - 299
    ).ts == str(TS)


def _refusal(
    header: str | None, *, method: str = "POST", path: str = PATH, token=TOKEN, now: float = TS
) -> AuthRefused:
    with pytest.raises(AuthRefused) as caught:
        verify(header, method, path, token, now=now)
    return caught.value


def test_clock_skew_beyond_five_minutes_is_refused_with_the_numbers() -> None:
    header = sign("n_w0", TOKEN, "POST", PATH, now=TS)
    late = _refusal(header, now=TS + 301)
    assert late.reason is Refusal.SKEW
    assert "301s behind" in str(late) and "±300s" in str(late)
    early = _refusal(header, now=TS - 400)
    assert early.reason is Refusal.SKEW and "ahead of" in str(early)


@pytest.mark.parametrize(
    ("header", "reason", "words"),
    [
        (None, Refusal.MISSING, "no X-Opod-Auth header"),
        ("  ", Refusal.MISSING, "no X-Opod-Auth header"),
        ("Bearer abc", Refusal.MALFORMED, "not key=value"),
        (f"v=1,id=n,sig={SIG}", Refusal.MALFORMED, "lacks ts"),
        (f"v=2,id=n,ts={TS},sig={SIG}", Refusal.VERSION, "version '2'"),
        (f"v=1,id=n,ts=soon,sig={SIG}", Refusal.TIMESTAMP, "ts 'soon' is not a unix time"),
        (f"v=1,id=n,ts=-5,sig={SIG}", Refusal.TIMESTAMP, "not a unix time"),
        (f"v=1,id=n,ts={TS}.5,sig={SIG}", Refusal.TIMESTAMP, "whole seconds"),
        (f"v=1,id=n,ts={TS},sig=XYZ", Refusal.MALFORMED, "64 lowercase hex"),
    ],
)
def test_malformed_headers_are_refused_with_a_reason(header: str | None, reason: Refusal, words: str) -> None:
    refused = _refusal(header)
    assert refused.reason is reason
    assert words in str(refused)


def test_a_wrong_token_a_wrong_path_or_an_unknown_node_is_refused() -> None:
    header = sign("n_w0", TOKEN, "POST", PATH, now=TS)
    assert _refusal(header, token="another-token").reason is Refusal.SIGNATURE
    assert _refusal(header, path="/admin/v1/nodes/register").reason is Refusal.SIGNATURE
    assert _refusal(header, method="GET").reason is Refusal.SIGNATURE
    unknown = _refusal(header, token=lambda node: None)
    assert unknown.reason is Refusal.UNKNOWN_NODE and unknown.node_id == "n_w0"


def test_parse_header_tolerates_spaces() -> None:
    parsed = parse_header(f"v=1, id=n_w0, ts={TS}, sig={SIG}")
    assert (parsed.node_id, parsed.unix, parsed.sig) == ("n_w0", TS, SIG)


def test_a_nonce_is_signed_so_it_cannot_be_swapped() -> None:
    header = sign("n_w0", TOKEN, "POST", PATH, now=TS, nonce="b1.7")
    assert ",n=b1.7," in header
    assert verify(header, "POST", PATH, TOKEN, now=TS).nonce == "b1.7"
    assert signature(TOKEN, "POST", PATH, TS, "b1.7") != SIG
    swapped = header.replace("n=b1.7", "n=b1.8")
    assert _refusal(swapped).reason is Refusal.SIGNATURE
    assert _refusal(header.replace("n=b1.7", "n=b 1")).reason is Refusal.MALFORMED
