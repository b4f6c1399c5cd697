"""``opod catalog pull ID``: a fetch shows its size and moves, in a log a line per tenth."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tests.cli.test_catalog_cli import opod
from tests.support.hubserver import HubServer

ENTRY = """\
id: acme-tiny
display_name: Acme tiny
source: {type: huggingface, repo: acme/tiny-GGUF, file: tiny-Q4_K_M.gguf}
size_bytes: 12000000
context_window: 2048
capabilities: [chat]
recommended_engines: [llamacpp]
hardware: {min_ram_gb: 1}
tags: [tiny]
license: apache-2.0
"""


def test_pull_in_a_log_says_the_size_and_a_line_per_tenth(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "catalog").mkdir(parents=True)
    (home / "catalog" / "acme-tiny.yaml").write_text(ENTRY)
    data = b"GGUF" + os.urandom(12_000_000)
    with HubServer().running_in_thread() as hub:
        hub.add_file("acme/tiny-GGUF", "tiny-Q4_K_M.gguf", data, lfs=True)
        result = opod("catalog", "pull", "acme-tiny", home=home, env={"HF_ENDPOINT": hub.url})
        again = opod("catalog", "pull", "acme-tiny", home=home, env={"HF_ENDPOINT": hub.url})
    assert result.returncode == 0, result.stderr
    steps = re.findall(r"^acme-tiny: fetching: (\d+)% of 12\.0 MB \(", result.stderr, re.MULTILINE)
    assert steps[0] == "0" and steps[-1] == "100", result.stderr
    assert len(steps) >= 5 and len(steps) == len(set(steps)) <= 11, "a line per tenth, not per chunk"
    assert re.search(r"MB/s\)$", result.stderr, re.MULTILINE), "the rate is shown"
    shown = result.stdout.strip()
    assert shown.startswith("acme-tiny: ") and shown.endswith("(12.0 MB)"), shown
    path = Path(shown.removeprefix("acme-tiny: ").rsplit(" (", 1)[0])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert again.returncode == 0 and "fetching" not in again.stderr, "a file already here is not fetched again"


def test_pull_of_an_unknown_id_or_an_ollama_entry_is_one_line(tmp_path: Path) -> None:
    unknown = opod("catalog", "pull", "qwen3", home=tmp_path)
    assert unknown.returncode == 1 and "Did you mean" in unknown.stderr and "Traceback" not in unknown.stderr
    ollama = opod("catalog", "pull", "gemma4-12b", home=tmp_path)
    assert ollama.returncode == 1 and "the ollama engine pulls it by that name itself" in ollama.stderr
    assert len(ollama.stderr.strip().splitlines()) == 1 and "Traceback" not in ollama.stderr
