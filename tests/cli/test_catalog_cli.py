"""`opod` as a user runs it: the installed console script, its output and its exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opod import __version__
from opod.catalog import bundled_dir


def opod(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The console script as a user runs it, output piped (not a terminal); ``env`` on top of a clean environment."""
    script = shutil.which("opod", path=str(Path(sys.executable).parent))
    assert script, "the opod console script is not installed beside this Python; run pip install -e '.[test]'"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OPOD_", "HF_"))}
    environ.update(OPOD_HOME=str(home), COLUMNS="200", NO_COLOR="1", **(env or {}))
    return subprocess.run([script, *args], capture_output=True, text=True, env=environ, timeout=60)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "opod-home"


def test_version_and_help(home: Path) -> None:
    version = opod("--version", home=home)
    assert version.returncode == 0 and version.stdout.strip() == f"opod {__version__}"
    helptext = opod("--help", home=home)
    assert helptext.returncode == 0 and "catalog" in helptext.stdout


def test_catalog_ls_lists_every_entry(home: Path) -> None:
    result = opod("catalog", "ls", home=home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "SIZE", "CONTEXT"]
    assert any(line.startswith("smollm2-135m-instruct ") for line in lines)
    count = len(list(bundled_dir().glob("*.yaml")))
    assert f"{count} models." in result.stdout


def test_catalog_ls_json_is_the_entries(home: Path) -> None:
    result = opod("catalog", "ls", "--json", home=home)
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids) and "qwen2.5-0.5b-gguf" in ids
    tiny = next(e for e in entries if e["id"] == "qwen2.5-0.5b-gguf")
    assert tiny["source"] == {
        "type": "huggingface",
        "repo": "bartowski/Qwen2.5-0.5B-Instruct-GGUF",
        "file": "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf",
    }
    assert tiny["architecture"]["head_dim"] == 64


def test_catalog_show_prints_the_kv_cost(home: Path) -> None:
    result = opod("catalog", "show", "qwen2.5-0.5b-gguf", home=home)
    assert result.returncode == 0, result.stderr
    assert "KV cache  12 KiB per token (fp16, grouped-query attention)" in result.stdout
    assert "384 MiB for one sequence at the full 32,768-token context" in result.stdout
    window = opod("catalog", "show", "gpt-oss-20b", home=home)
    assert "beyond the 128-token window 24 KiB per token" in window.stdout


def test_catalog_show_json_and_unknown_architecture_warns(home: Path) -> None:
    result = opod("catalog", "show", "llama-3.1-8b", "--json", home=home)
    body = json.loads(result.stdout)
    assert body["kv_cache"]["bytes_per_token"] == 131_072
    unknown = opod("catalog", "show", "gemma4-12b", home=home)
    assert unknown.returncode == 0
    assert "KV cache  unknown" in unknown.stdout
    assert "warning: layers not stated" in unknown.stderr


def test_an_unknown_id_says_what_to_do_without_a_traceback(home: Path) -> None:
    result = opod("catalog", "show", "qwen3", home=home)
    assert result.returncode == 1
    assert "no catalog entry 'qwen3'" in result.stderr and "Did you mean qwen3-" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_a_home_catalog_entry_shows_up_and_a_broken_one_is_reported(home: Path) -> None:
    (home / "catalog").mkdir(parents=True)
    text = (bundled_dir() / "qwen2.5-0.5b-gguf.yaml").read_text()
    (home / "catalog" / "my-model.yaml").write_text(text.replace("id: qwen2.5-0.5b-gguf", "id: my-model"))
    (home / "catalog" / "half.yaml").write_text("id: half\n")
    result = opod("catalog", "ls", home=home)
    assert result.returncode == 0
    assert any(line.startswith("my-model ") for line in result.stdout.splitlines())
    assert "half.yaml" in result.stderr and "display_name: required" in result.stderr


def test_validate_passes_good_files_and_fails_bad_ones(home: Path, tmp_path: Path) -> None:
    good = opod("catalog", "validate", str(bundled_dir()), home=home)
    assert good.returncode == 0 and "✗" not in good.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: bad\ndisplay_name: Bad\nsource: {type: file}\n")
    result = opod("catalog", "validate", str(bad), home=home)
    assert result.returncode == 1
    assert "source: source type 'file' needs path" in result.stderr
    assert "size_bytes: required" in result.stderr
