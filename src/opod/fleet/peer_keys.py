"""The key a federation peer issued to this cluster, read from where the operator said it is.

``key_file`` is a path to a file holding the key, ``env:NAME`` (a variable of the leader's
environment), or ``vault:PATH#FIELD`` (a field of a secret in HashiCorp Vault's KV engine, read at
``$VAULT_ADDR/v1/PATH`` with ``$VAULT_TOKEN``; a KV version 2 secret is found under ``data.data``).
The key is read each time the peer is checked, so a rotated key is used from the next check on, and
it is never stored nor shown: views name only where it is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from opod import config

KEY_MAX = 4096
"""Characters of a key read: a key fits, a stray file does not."""


class PeerKeyError(Exception):
    """The key cannot be read; the message says where it was looked for and why."""


def key_reference_problem(reference: str) -> str | None:
    """What is wrong with ``reference`` as written, before anything is read; ``None`` when nothing is."""
    if not reference.strip():
        return "key_file: empty; name a file, env:NAME or vault:PATH#FIELD holding the key the peer issued"
    if reference.startswith("env:") and not reference[4:].strip():
        return "key_file: env: names no variable; write env:NAME"
    if reference.startswith("vault:"):
        path, _, field = reference[6:].partition("#")
        if not path.strip("/") or not field:
            return "key_file: write vault:PATH#FIELD, the secret's path and the field holding the key"
    return None


async def read_peer_key(reference: str, session: aiohttp.ClientSession) -> str:
    """The key ``reference`` names; :class:`PeerKeyError` saying why when it cannot be read."""
    problem = key_reference_problem(reference)
    if problem is not None:
        raise PeerKeyError(problem)
    if reference.startswith("env:"):
        value = config.named_by_operator(reference[4:].strip())
        if value is None:
            raise PeerKeyError(f"the variable {reference[4:]!r} is not set in the leader's environment")
        return _checked(value, reference)
    if reference.startswith("vault:"):
        return _checked(await _vault(reference, session), reference)
    path = Path(reference).expanduser()
    try:
        text = await asyncio.to_thread(path.read_text, encoding="utf-8")
    except OSError as err:
        raise PeerKeyError(f"cannot read the key file {str(path)!r}: {err.strerror or err}") from None
    return _checked(text.strip(), reference)


def _checked(value: str, reference: str) -> str:
    if not value or len(value) > KEY_MAX or any(c.isspace() for c in value):
        raise PeerKeyError(f"{reference!r} does not hold one key (empty, spaced, or longer than {KEY_MAX} characters)")
    return value


async def _vault(reference: str, session: aiohttp.ClientSession) -> str:
    address, token = config.read("VAULT_ADDR"), config.read("VAULT_TOKEN")
    if address is None or token is None:
        raise PeerKeyError(f"{reference!r} is in Vault, and the leader has no VAULT_ADDR and VAULT_TOKEN to read it")
    path, _, field = reference[6:].partition("#")
    url = f"{address.rstrip('/')}/v1/{path.strip('/')}"
    try:
        async with session.get(url, headers={"X-Vault-Token": token}) as answer:
            if answer.status != 200:
                raise PeerKeyError(f"Vault answered HTTP {answer.status} for {path!r}")
            body = await answer.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        raise PeerKeyError(f"Vault at {address} could not be read: {err or type(err).__name__}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if isinstance(data, dict) and isinstance(data.get("data"), dict):
        data = data["data"]  # KV version 2 keeps the secret's fields one level down
    value = data.get(field) if isinstance(data, dict) else None
    if not isinstance(value, str):
        raise PeerKeyError(f"the Vault secret {path!r} has no text field {field!r}")
    return value
