"""A real Prometheus server (Debian's ``prometheus`` package) for tests: a temp config and storage, a free port.

``Prometheus(home, {"job": ["127.0.0.1:8080"]})`` scrapes each job's targets' ``/metrics`` every
second; ``stop()`` ends it. :func:`binary` is ``None`` where the package is not installed, so a test
can skip saying how to install it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from pathlib import Path

from bench.ports import free_port
from tests.support.opod_process import http, wait_until

INSTALL = "apt-get install -y prometheus (Debian's package; .ci/run installs it)"


def binary() -> str | None:
    found = shutil.which("prometheus")
    if found:
        return found
    return "/usr/bin/prometheus" if Path("/usr/bin/prometheus").is_file() else None


class Prometheus:
    def __init__(self, home: Path, jobs: dict[str, list[str]], *, every: str = "1s") -> None:
        path = binary()
        if path is None:
            raise FileNotFoundError(f"no prometheus binary: {INSTALL}")
        home.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]} for job, targets in jobs.items()
            ],
        }
        (home / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = (home / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                path,
                f"--config.file={home / 'prometheus.yml'}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=home,
        )
        self.home = home
        try:
            wait_until(self._ready, 30, f"Prometheus to be ready on {self.url}; its log:\n{self.output}")
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"Prometheus exited with {self.process.returncode}:\n{self.output}")
        try:
            return http("GET", f"{self.url}/-/ready", timeout=2)[0] == 200
        except OSError:
            return False

    @property
    def output(self) -> str:
        self._log.flush()
        return (self.home / "prometheus.log").read_text(errors="replace")

    def instant(self, expr: str) -> list[dict]:
        """The series ``expr`` has now (``/api/v1/query``)."""
        status, _, body = http("GET", f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=5)
        assert status == 200, body
        assert isinstance(body, dict)
        return body["data"]["result"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
