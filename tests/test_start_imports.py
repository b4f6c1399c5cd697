"""A leader starts without the modules only a rare request or feature needs: they are imported at first use.

The test suite starts over a hundred real leaders, so each tenth of a second a leader spends on
imports is minutes of CI; a fleet restarting its leaders waits on them too. Each module below was
imported at every start once; an import of it at module level, anywhere the leader reaches, fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

IMPORTED_AT_FIRST_USE = {
    "scim2_models": "half a second; only a SCIM call needs it (opod.control.scim_resources)",
    "authlib": "only signing in through an OpenID provider (opod.access.oidc)",
    "joserfc": "only an OpenID provider's ID token and keys (opod.access.oidc, opod.access.oidc_provider)",
    "httpx2": "only calls to an OpenID provider (opod.access.oidc, opod.access.oidc_provider)",
    "ldap3": "only a directory, auth.ldap (opod.access.directory_ldap)",
    "jsonschema": "only an eval suite's json_schema cases (opod.control.evals.suites, scoring)",
    "numpy": "only cutting an embedding to its dimensions, or converting a BERT (opod.gateway.embeddings)",
    "gguf": "only converting a BERT to GGUF (opod.weights.minilm)",
}


def test_the_leader_starts_without_the_modules_only_a_rare_request_needs() -> None:
    names = sorted(IMPORTED_AT_FIRST_USE)
    code = f"import json, sys, opod.leader.run; print(json.dumps([m for m in {names!r} if m in sys.modules]))"
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == [], "imported at the leader's start:\n" + "\n".join(
        f"{name}: {IMPORTED_AT_FIRST_USE[name]}" for name in imported
    )
