"""OpenAI's Files API has bounds: uploads streamed into the store, a quota per project, space given back on delete.

One real leader (``opod up --no-worker``) and the ``openai`` package. Four large uploads at once
leave the leader's peak memory where it was (a file is never held whole in memory); a project's
upload past the settings' ``files.project_bytes`` is refused with a 413 naming that key; the
database file shrinks when files are deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.opod_process import Leader

MIB = 1 << 20
LARGE = 48 * MIB
CONCURRENT = 4
FLAT = LARGE
"""How much the leader's peak memory may grow while the uploads run: less than one of the files."""


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    running = Leader(tmp_path_factory.mktemp("files") / "home", worker=False, extra=["--no-default-models"])
    try:
        yield running
    finally:
        running.process.stop()


@pytest.fixture(scope="module")
def large_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A batch input of LARGE bytes, on disk: the client streams it, so only the leader's memory is measured."""
    path = tmp_path_factory.mktemp("upload") / "large.jsonl"
    line = b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}'.ljust(1023) + b"\n"
    with path.open("wb") as out:
        for _ in range(LARGE // len(line)):
            out.write(line)
    return path


def client(leader: Leader, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=leader.url + "/v1", api_key=key, max_retries=0, timeout=120)


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def database_bytes(leader: Leader) -> int:
    return sum(p.stat().st_size for p in leader.home.glob("opod.db*") if p.name != "opod.db-shm")


def put_settings(leader: Leader, body: str) -> None:
    status, current = leader.admin("GET", "/api/v1/settings")
    assert status == 200, current
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": current.get("version", 0), "body": body})
    assert status == 200, answer


def project_key(leader: Leader, name: str, project: str) -> str:
    status, body = leader.admin("POST", "/api/v1/keys", {"name": name, "project": project})
    assert status == 201, body
    return str(body["secret"])


def test_concurrent_large_uploads_keep_the_leaders_memory_flat_and_deletes_shrink_the_database(
    leader: Leader, large_file: Path
) -> None:
    files = client(leader, leader.key)
    files.files.delete(files.files.create(file=("warm.jsonl", b"{}\n"), purpose="batch").id)
    pid = leader.process.proc.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the present
    before = status_kib(pid, "VmHWM")
    uploaded: list[str] = []
    failures: list[BaseException] = []

    def upload() -> None:
        try:
            with large_file.open("rb") as handle:
                uploaded.append(files.files.create(file=("large.jsonl", handle), purpose="batch").id)
        except BaseException as err:  # shown by the assertion below
            failures.append(err)

    threads = [threading.Thread(target=upload) for _ in range(CONCURRENT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    peak = status_kib(pid, "VmHWM")
    assert not failures and len(uploaded) == CONCURRENT, failures
    grew = peak - before
    assert grew < FLAT, f"{CONCURRENT} uploads of {LARGE // MIB} MiB took the leader's peak up {grew // MIB} MiB"
    assert all(files.files.retrieve(file_id).bytes == LARGE for file_id in uploaded)
    with large_file.open("rb") as handle:
        assert files.files.content(uploaded[0]).content == handle.read()

    full = database_bytes(leader)
    assert full > CONCURRENT * LARGE
    for file_id in uploaded:
        assert files.files.delete(file_id).deleted
    emptied = database_bytes(leader)
    assert emptied < full - (CONCURRENT - 0.5) * LARGE, f"the database kept {emptied // MIB} MiB of {full // MIB} MiB"


def test_an_upload_past_its_projects_quota_is_refused_with_413_naming_the_quota(leader: Leader) -> None:
    for path, body in (
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/teams", {"name": "ml", "in": "acme"}),
        ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ("/api/v1/projects", {"name": "eval", "in": "acme/ml"}),
    ):
        status, answer = leader.admin("POST", path, body)
        assert status == 201, answer
    put_settings(leader, "files:\n  project_bytes: 3000000\n")
    one, other = client(leader, project_key(leader, "one", "acme/ml/chat")), None
    two = client(leader, project_key(leader, "two", "acme/ml/chat"))
    other = client(leader, project_key(leader, "other", "acme/ml/eval"))
    chunk = b"x" * 1_000_000
    one.files.create(file=("a.jsonl", chunk), purpose="batch")
    kept = two.files.create(file=("b.jsonl", chunk), purpose="batch")  # one project: the two keys share its quota
    with pytest.raises(openai.APIStatusError) as refused:
        one.files.create(file=("c.jsonl", chunk * 2), purpose="batch")
    assert refused.value.status_code == 413
    message = str(refused.value.message)
    assert "files.project_bytes" in message and "3000000" in message and "2000000" in message, message
    assert len(one.files.list().data) == 2, "the refused file is not kept"
    other.files.create(file=("d.jsonl", chunk * 2), purpose="batch")  # another project has its own
    two.files.delete(kept.id)
    one.files.create(file=("c.jsonl", chunk * 2), purpose="batch")  # a delete gives the room back
