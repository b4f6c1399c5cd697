"""A real OpenID provider on loopback for the sign-in tests, and a browser's part in signing in there, over plain HTTP.

The provider is panva's ``oidc-provider`` (npm), run by Debian's ``node`` from
``tests/support/oidc_provider/server.js``; ``.ci/run`` installs its modules with ``npm ci``. By hand::

    cd tests/support/oidc_provider && npm ci
    node server.js --port 4000 --redirect-uri http://127.0.0.1:8080/auth/oidc/callback

Its people (``ada``, ``bob``, ``carol``, and ``mallory`` whose e-mail is unverified) sign in with any password.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import parse_qsl, urljoin, urlsplit

import httpx
import pytest

from bench.ports import free_port
from tests.support.opod_process import wait_until

HERE = Path(__file__).resolve().parent / "oidc_provider"
CLIENT_ID = "opod"
CLIENT_SECRET = "opod-test-client-secret"
INSTALL = (
    "install Node.js 20.19 or later (apt-get install nodejs npm) and the provider's modules "
    "(cd tests/support/oidc_provider && npm ci), as .ci/run does"
)


def require_node() -> str:
    """The ``node`` binary, with the provider's modules installed; the test skips, saying how to install, otherwise."""
    node = shutil.which("node")
    if node is None:
        pytest.skip(f"no node binary to run the OpenID provider: {INSTALL}")
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        pytest.skip(f"the OpenID provider's modules are not installed: {INSTALL}")
    return node


READY_WITHIN = 30.0
"""Seconds a provider's process has to say it is ready (it takes one or two on a loaded machine)."""
START_TRIES = 3


class OpenIdProvider:
    """One ``oidc-provider`` process on a loopback port; its issuer is ``http://127.0.0.1:PORT``."""

    def __init__(self, redirect_uri: str, *, claim_issuer: str = "", port: int | None = None) -> None:
        self.node = require_node()
        self.redirect_uri = redirect_uri
        self.claim_issuer = claim_issuer
        self.port = port or free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        """Start it (again): a restart makes a new signing key, as a provider rotating its keys does.

        A node process that has not said it is ready within :data:`READY_WITHIN` is killed and started again: one
        once hung at start-up on a lock of its own, and the suite with it."""
        for _ in range(START_TRIES):
            if self._started():
                wait_until(self._answers, timeout=10, what=f"the OpenID provider at {self.issuer}")
                return
        raise RuntimeError(f"the OpenID provider did not say it was ready in {START_TRIES} starts")

    def _started(self) -> bool:
        argv = [self.node, "server.js", "--port", str(self.port), "--redirect-uri", self.redirect_uri]
        argv += ["--client-id", CLIENT_ID, "--client-secret", CLIENT_SECRET]
        if self.claim_issuer:
            argv += ["--claim-issuer", self.claim_issuer]
        process = self.process = subprocess.Popen(
            argv, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        said: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:  # its warnings, then "ready ISSUER"
                said.append(line)
                if line.startswith("ready "):
                    ready.set()
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if ready.wait(READY_WITHIN):
            return True
        if process.poll() is not None:
            reader.join(5)
            raise RuntimeError(f"the OpenID provider ended before it listened (exit {process.returncode}): {said}")
        process.kill()
        process.wait(10)
        reader.join(5)
        return False

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


def sign_in_at_provider(
    redirect_url: str, account: str, back_to: str, *, abort: bool = False, edit: dict[str, str] | None = None
) -> dict[str, str]:
    """What a browser does with ``begin``'s address: follow it to the provider's login form, sign in there as
    ``account`` (or press cancel, with ``abort``), follow the provider back; the query the callback at ``back_to``
    would get. ``edit`` changes parameters of the address first (a tampered request)."""
    url = redirect_url
    if edit:
        parts = urlsplit(url)
        query = {**dict(parse_qsl(parts.query)), **edit}
        url = parts._replace(query=httpx.QueryParams(query).__str__()).geturl()
    with httpx.Client(follow_redirects=False, timeout=10) as browser:
        for _ in range(12):
            if url.startswith(back_to):
                return dict(parse_qsl(urlsplit(url).query))
            answer = browser.get(url)
            if answer.is_redirect:
                url = urljoin(url, answer.headers["location"])
                continue
            assert answer.status_code == 200 and 'name="login"' in answer.text, (answer.status_code, answer.text[:500])
            if abort:
                answer = browser.get(url.rstrip("/") + "/abort")
            else:
                answer = browser.post(url, data={"prompt": "login", "login": account, "password": "anything"})
            assert answer.is_redirect, (answer.status_code, answer.text[:500])
            url = urljoin(url, answer.headers["location"])
    raise AssertionError(f"the provider never sent the browser back to {back_to}; last at {url}")


__all__ = ["CLIENT_ID", "CLIENT_SECRET", "OpenIdProvider", "require_node", "sign_in_at_provider"]
