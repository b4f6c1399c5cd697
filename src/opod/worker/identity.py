"""Who a worker is: a node id kept across restarts, and a boot id minted per process."""

from __future__ import annotations

import re
import secrets
import socket
from pathlib import Path

import yaml

from opod import config
from opod.contract import env as contract_env

_SAFE = re.compile(r"[^a-z0-9-]+")


def node_id(home: Path, *, default: str | None = None) -> str:
    """``OPOD_NODE_ID``, else the id in ``node.yaml``, else a new one written there."""
    given = config.read(contract_env.ENV_NODE_ID)
    if given:
        return given
    path = home / "node.yaml"
    if path.exists():
        data = yaml.safe_load(path.read_text()) or {}
        if isinstance(data, dict) and isinstance(data.get("id"), str) and data["id"]:
            return data["id"]
    new = default or "n_" + (
        _SAFE.sub("-", socket.gethostname().lower()).strip("-") or "worker"
    ) + "-" + secrets.token_hex(2)
    home.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"id": new}))
    return new


def boot_id() -> str:
    return secrets.token_hex(8)


def advertise_address(listen_host: str, port: int, leader_url: str) -> str:
    """host:port the leader should dial: ``OPOD_ADVERTISE_ADDR``, else the address that reaches the leader."""
    given = config.read(contract_env.ENV_ADVERTISE_ADDR)
    if given:
        return given
    if listen_host not in ("0.0.0.0", "::", ""):
        return f"{listen_host}:{port}"
    from urllib.parse import urlsplit

    target = urlsplit(leader_url).hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            return f"{probe.getsockname()[0]}:{port}"
    except OSError:
        return f"127.0.0.1:{port}"
