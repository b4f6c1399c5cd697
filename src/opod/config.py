"""The one place opod reads its environment.

Two kinds of variable exist: the contract's (:mod:`opod.contract.env`, which a
manager renders) and opod's own config overrides declared below (spellings of
settings that are not contract data). Every read goes through :func:`read`, so
a name that is in neither table cannot be read at all; a test holds the rest
of ``src/opod`` to that.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True, slots=True)
class Override:
    name: str
    doc: str


CONFIG_OVERRIDES: tuple[Override, ...] = (
    Override("OPOD_HOME", "Data directory: the store, keys, downloaded models, ~/.opod/catalog (default ~/.opod)."),
    Override(
        "OPOD_DATABASE_URL",
        "SQLAlchemy URL of the store; default SQLite at ~/.opod/opod.db. A postgresql+psycopg:// URL lets several leaders share one store.",
    ),
    Override("OPOD_LISTEN", "host:port of the leader's public listener (default 0.0.0.0:8080)."),
    Override("OPOD_ADMIN_LISTEN", "host:port of the leader's admin listener for /api/v1 (default 127.0.0.1:9090)."),
    Override(
        "OPOD_WORKER_LISTEN",
        "host:port of the worker's listener (default 0.0.0.0:8081; 127.0.0.1:8081 for opod up's local worker).",
    ),
    Override("OPOD_LLAMA_SERVER", "Path of a llama-server binary to use instead of the bundled one."),
    Override("OPOD_URL", "Base URL of the leader that opod commands talk to (default http://127.0.0.1:8080)."),
    Override(
        "OPOD_ADMIN_URL",
        "Base URL of the leader's admin listener that opod commands talk to (default http://127.0.0.1:9090).",
    ),
    Override("OPOD_ADMIN_KEY", "Admin key for opod commands (default: the contents of ~/.opod/admin.key)."),
    Override(
        "OPOD_SECRETS_KEY_FILE",
        "Path of the key that seals the secrets kept in the store, in place of ~/.opod/secrets.key (made on first start). "
        "Every leader sharing one store needs the same key: copy the first leader's secrets.key to each, or name one shared file here.",
    ),
    Override(
        "OPOD_PROBE_LISTEN",
        "host:port of a plain listener that serves only /healthz, /readyz, /loadz and /metrics; unset = none.",
    ),
    Override("OPOD_USAGE_RETENTION_DAYS", "Days usage rows and lifecycle events are kept in the store (default 30)."),
    Override("OPOD_TLS_CERT", "PEM certificate of the leader's public listener; with OPOD_TLS_KEY it serves HTTPS."),
    Override("OPOD_TLS_KEY", "PEM private key for OPOD_TLS_CERT."),
    Override(
        "OPOD_NODE_CERT",
        "PEM client certificate a worker presents to a TLS leader; its URI SAN spiffe://<trust domain>/opod/node/<id> names the node. With OPOD_NODE_KEY.",
    ),
    Override("OPOD_NODE_KEY", "PEM private key for OPOD_NODE_CERT."),
    Override(
        "OPOD_STOP_GRACE",
        "Seconds a stopping leader or worker lets requests in flight finish before it stops its engines (default 30; 0 = stop at once).",
    ),
    Override(
        "OPOD_INVENTORY",
        "Path of a declared inventory (YAML or JSON: GPUs, MIG instances, labels) a worker reports instead of its driver's; --inventory names it too.",
    ),
    Override(
        "OPOD_HUGE_PAGES",
        "0 to run the leader on Python's own allocator; by default opod up restarts itself once on glibc's malloc with transparent huge pages, where Linux, glibc 2.35+ and the kernel's setting allow.",
    ),
    Override(
        "OPOD_LOOP_CPU",
        "The leader's event loop thread: auto (the default) pins it, where the process may run on more than one CPU, to the one fewest other processes are pinned to; off lets it move; a number pins it to that CPU. What it starts runs free.",
    ),
    Override(
        "OPOD_ENGINE_CPUS",
        "Where a worker and its engines run beside leaders' pinned event loops on its machine: apart (the default) keeps opod join's worker, and an engine computing on a GPU or the simulator, off the loops' CPUs wherever a CPU is left; all leaves them on every CPU. An engine computing on the CPU (llama.cpp) gets every CPU.",
    ),
    Override("OPOD_DOOR_ROUTES", "Path of the door's routes file (opod up --role door); --routes names it too."),
    Override(
        "OPOD_UPGRADE_COMMAND",
        "The command a worker runs to install the release the operator wants ({python} and {version} filled in; split as a shell would, run without one). Default: {python} -m pip install --upgrade opod=={version}.",
    ),
    Override(
        "OPOD_PROMETHEUS_URL",
        "Base URL of the Prometheus server this leader asks, in place of the cluster settings' prometheus.url (shown in local_keys).",
    ),
    Override(
        "OPOD_ENGINE_INSTALL_COMMAND",
        "Command a worker runs to install an engine build the operator chose (POST /api/v1/nodes/{id}/engines), "
        "split like a shell line and run without one; {python}, {package}, {build} and {index} are filled in "
        "(default: {python} -m pip install {package} --extra-index-url {index}).",
    ),
    Override("VAULT_ADDR", "HashiCorp Vault's address, for a federation peer's key named vault:PATH#FIELD."),
    Override("VAULT_TOKEN", "The token a leader reads Vault with, for a federation peer's key named vault:PATH#FIELD."),
)

EVAL_DIR = Override(
    "OPOD_EVAL_DIR",
    "Directory of the leader's quality suites (*.yaml, *.yml, *.json), run by name (GET /api/v1/eval/suites); "
    "default <OPOD_HOME>/evals.",
)
CONFIG_OVERRIDES += (EVAL_DIR,)

_OVERRIDE_NAMES = frozenset(o.name for o in CONFIG_OVERRIDES)


def declared(name: str) -> bool:
    """True when ``name`` is a contract variable or a declared config override."""
    return name in _OVERRIDE_NAMES or _contract().lookup(name) is not None


def _contract() -> ModuleType:
    """The contract's table of variables, imported when first asked for: reading one of opod's own overrides (the
    ``opod`` command's first read, :mod:`opod.cli.heap`) does not load the contract's models."""
    from opod.contract import env

    return env


def read(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value with surrounding whitespace trimmed; ``None`` when unset or blank."""
    if not declared(name):
        raise KeyError(f"{name} is neither a contract variable nor a declared config override (opod.config)")
    value = (os.environ if environ is None else environ).get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def environment() -> Mapping[str, str]:
    """This process's whole environment, for what hands it on whole (``opod up`` restarting itself,
    :mod:`opod.cli.heap`)."""
    return os.environ


def unset(names: tuple[str, ...]) -> None:
    """Take ``names`` out of this process's environment: the processes it starts from then on do not inherit them."""
    for name in names:
        os.environ.pop(name, None)


def named_by_operator(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """A variable a setting names by itself (a federation peer's key as ``env:NAME``): read because an operator
    asked for it by that name, so it is in no table. ``None`` when unset or blank."""
    value = (os.environ if environ is None else environ).get(name)
    return value.strip() if value is not None and value.strip() else None


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """A boolean variable: true for ``1`` or ``true`` (any case)."""
    value = read(name, environ)
    return value is not None and value.lower() in ("1", "true")


def home(environ: Mapping[str, str] | None = None) -> Path:
    """opod's data directory."""
    value = read("OPOD_HOME", environ)
    return Path(value).expanduser() if value else Path.home() / ".opod"


def eval_dir(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    """``OPOD_EVAL_DIR``: where the leader whose data directory is ``home`` reads its quality suites."""
    value = read(EVAL_DIR.name, environ)
    return Path(value).expanduser() if value else home / "evals"


LOCAL_SETTINGS: dict[str, str] = {"OPOD_PROMETHEUS_URL": "prometheus.url"}
"""Variables that override a key of the cluster's settings on this leader only: variable → dotted settings key."""


def local_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The cluster settings' keys this leader's environment overrides, dotted key → value (only those set)."""
    return {key: value for name, key in LOCAL_SETTINGS.items() if (value := read(name, environ)) is not None}


DEFAULT_STOP_GRACE = 30.0
MAX_STOP_GRACE = 3600.0


def stop_grace(environ: Mapping[str, str] | None = None) -> float:
    """``OPOD_STOP_GRACE``: seconds requests in flight may take to finish when the process is told to stop.

    Raises ``ValueError`` naming the variable for anything but a number of seconds from 0 to an hour.
    """
    value = read("OPOD_STOP_GRACE", environ)
    if value is None:
        return DEFAULT_STOP_GRACE
    try:
        seconds = float(value.removesuffix("s"))
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds <= MAX_STOP_GRACE:  # NaN fails too
        raise ValueError(
            f"OPOD_STOP_GRACE={value!r} is not a number of seconds; set one from 0 to {MAX_STOP_GRACE:.0f}, "
            f"or unset it for {DEFAULT_STOP_GRACE:.0f}"
        )
    return seconds


ACTED_ON = frozenset(
    {
        "OPOD_PLAN_FILE",
        "OPOD_AUTH_FILE",
        "OPOD_POLICY_FILE",
        "OPOD_COORDINATOR_NODE",
        "OPOD_ENGINE_FLAGS",
        "OPOD_REJECT_BEARER",
        "OPOD_SLEEP_MODE",
        "OPOD_PLAN_REVISION",
        "OPOD_ADVERTISE_ADDR",
        "OPOD_NODE_ID",
        "OPOD_LEADER_CA",
        "OPOD_CATALOG_DIR",
        "OPOD_CATALOG_PUBKEY",
        "OPOD_CATALOG_REQUIRE_SIGNED",
        "OPOD_SKIP_SOURCE_CHECK",
        "HF_TOKEN",
        "HF_ENDPOINT",
        "OPOD_MODEL_REVISION",
        "OPOD_MODEL_SHA256",
    }
)
"""Contract variables this build acts on. OPOD_REJECT_BEARER and OPOD_SKIP_SOURCE_CHECK hold always:
workers never accept a bearer token, and no model source is ever checked ahead of a download."""


def unsupported_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line for each contract variable that is set but that this build does not act on."""
    source = os.environ if environ is None else environ
    lines = []
    for row in _contract().env():
        if row.name in source and row.name not in ACTED_ON:
            feature = f" (feature {row.since} is not offered)" if row.since and not row.since.startswith("v") else ""
            lines.append(f"{row.name} is set but this build of opod does not act on it{feature}; it is ignored.")
    return lines


def retired_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line for each retired variable set in the environment, naming what to do instead."""
    source = os.environ if environ is None else environ
    lines = []
    for row in _contract().retired():
        if row.name in source:
            lines.append(f"{row.name} is set but was retired in {row.retired_in}: {row.note} Remove it.")
    return lines
