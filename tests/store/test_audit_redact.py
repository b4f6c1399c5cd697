"""What the audit keeps of a change's body: secrets taken out by field name at any depth, key-like text anywhere."""

from __future__ import annotations

from opod.store.audit import REDACTED, detail_text, redact


def test_fields_that_hold_secrets_are_redacted_at_any_depth() -> None:
    body = {
        "name": "scim",
        "value": "hunter2",
        "settings": {"ldap": {"password": "pw", "bind_dn": "cn=admin"}},
        "webhooks": [{"url": "https://hooks.example/x", "secret": "whsec"}],
        "key_id": "k_1",
        "token_id": "t_1",
    }
    assert redact(body) == {
        "name": "scim",
        "value": REDACTED,
        "settings": {"ldap": {"password": REDACTED, "bind_dn": "cn=admin"}},
        "webhooks": [{"url": "https://hooks.example/x", "secret": REDACTED}],
        "key_id": "k_1",
        "token_id": "t_1",
    }


def test_key_like_text_is_redacted_wherever_it_is() -> None:
    secret = "sk-opod-4f9c2a7d1e6b8c3f0a5d9e2b7c4f1a8d"
    node = "sk-node-t_0ca13dee28a3b257.nlqkjur7g57f4jpjgsiuopu7svzn3o3iw3djfpulwo7lbfj3kgwa"
    text = detail_text({"name": f"copied {secret} by mistake", "note": [node]})
    assert secret not in text and node not in text and "copied" in text and "by mistake" in text


def test_an_empty_detail_is_empty_and_text_stays_text() -> None:
    assert detail_text(None) == "" and detail_text({}) == ""
    assert detail_text("plain words") == "plain words"
