"""Client jobs in the store: files, batches and their lines; a line is answered and counted once, on both databases."""

from __future__ import annotations

import io
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from opod.store import InvalidInput, Store
from opod.store.client_jobs import JobLine
from opod.store.files import CHUNK_BYTES, FILE_MAX_BYTES, OverQuota
from opod.store.migrate import alembic_config


def _lines(n: int) -> list[JobLine]:
    return [
        JobLine(i, f"req-{i}", json.dumps({"model": "m", "messages": [{"role": "user", "content": str(i)}]}))
        for i in range(1, n + 1)
    ]


def _job(
    store: Store,
    n: int = 5,
    *,
    key: str = "k_a",
    project: str = "",
    window: timedelta = timedelta(hours=24),
    leased_to: tuple[str, timedelta] | None = None,
):
    source = store.add_file(owner_key_id=key, project_id=project, purpose="batch", filename="in.jsonl", content=b"{}\n")
    return store.create_client_job(
        owner_key_id=key,
        project_id=project,
        endpoint="/v1/chat/completions",
        model="m",
        input_file_id=source.id,
        completion_window=window,
        window_text="24h",
        metadata_json="{}",
        lines=_lines(n),
        leased_to=leased_to,
    )


def test_a_file_keeps_its_bytes_and_is_seen_only_by_its_key_and_project(store: Store) -> None:
    content = bytes(range(256)) * 10
    mine = store.add_file(owner_key_id="k_a", project_id="p_1", purpose="batch", filename="a.jsonl", content=content)
    assert mine.id.startswith("file-") and mine.bytes == len(content)
    assert store.file_content(mine.id) == content
    assert store.get_file(mine.id, key_id="k_a") == mine
    assert store.get_file(mine.id, key_id="k_b", project_id="p_1") == mine, "a key of the same project sees it"
    assert (
        store.get_file(mine.id, key_id="k_b") is None
        and store.get_file(mine.id, key_id="k_b", project_id="p_2") is None
    )
    assert [f.id for f in store.list_files(key_id="k_b")] == []
    assert store.delete_file(mine.id) and store.file_content(mine.id) is None and not store.delete_file(mine.id)
    with pytest.raises(InvalidInput, match="at most"):
        store.add_file(
            owner_key_id="k_a", project_id="", purpose="batch", filename="big", content=b"x" * (FILE_MAX_BYTES + 1)
        )


def test_a_file_read_from_disk_is_kept_in_chunks_and_read_back_a_chunk_at_a_time(store: Store) -> None:
    content = os.urandom(2 * CHUNK_BYTES + 12345)
    record = store.add_file(
        owner_key_id="k_a", project_id="", purpose="batch", filename="big.jsonl", content=io.BytesIO(content)
    )
    assert record.bytes == len(content) and store.file_content(record.id) == content
    chunks = [store.file_chunk(record.id, seq) for seq in range(4)]
    assert [len(c or b"") for c in chunks] == [CHUNK_BYTES, CHUNK_BYTES, 12345, 0] and chunks[3] is None
    assert b"".join(c or b"" for c in chunks) == content
    empty = store.add_file(owner_key_id="k_a", project_id="", purpose="batch", filename="e", content=io.BytesIO())
    assert store.file_content(empty.id) == b"" and store.file_chunk(empty.id, 0) is None


def test_a_projects_files_are_bounded_by_its_quota_and_a_delete_gives_the_room_back(store: Store) -> None:
    def add(key: str, project: str, size: int):
        return store.add_file(
            owner_key_id=key, project_id=project, purpose="batch", filename="f", content=b"x" * size, quota=1000
        )

    first = add("k_a", "p_1", 600)
    add("k_b", "p_1", 400)  # two keys of one project share its quota
    with pytest.raises(OverQuota) as refused:
        add("k_b", "p_1", 1)
    assert (refused.value.used, refused.value.size, refused.value.quota) == (1000, 1, 1000)
    assert "project p_1 keeps 1000 bytes of files; 1 more would pass its quota of 1000 bytes" in str(refused.value)
    assert len(store.list_files(key_id="k_b", project_id="p_1")) == 2, "the refused file was not kept"
    add("k_c", "p_2", 1000)  # another project has its own
    add("k_d", "", 1000)  # a key in no project counts alone
    with pytest.raises(OverQuota, match="this key"):
        add("k_d", "", 1)
    add("k_e", "", 1000)
    store.delete_file(first.id)
    add("k_b", "p_1", 600)


def test_uploads_racing_for_a_projects_last_room_never_pass_its_quota_together(store: Store) -> None:
    def add(_: int) -> bool:
        try:
            store.add_file(
                owner_key_id="k_a", project_id="p_1", purpose="batch", filename="f", content=b"x" * 300, quota=1000
            )
        except OverQuota:
            return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        kept = sum(pool.map(add, range(8)))
    assert kept == 3 and sum(f.bytes for f in store.list_files(key_id="k_a", project_id="p_1")) == 900


def test_a_file_kept_whole_before_chunks_keeps_its_content_after_the_migration(db_url: str) -> None:
    content = os.urandom(3000)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(connection=conn), "0015")
        conn.execute(
            text(
                "INSERT INTO files (id, owner_key_id, project_id, purpose, filename, bytes, created_at, content) "
                "VALUES ('file-old', 'k_a', '', 'batch', 'old.jsonl', :n, :at, :content)"
            ),
            {"n": len(content), "at": datetime(2026, 1, 1, tzinfo=UTC), "content": content},
        )
    engine.dispose()
    with Store.open(db_url) as store:
        assert store.file_content("file-old") == content
        assert store.get_file("file-old") is not None and store.delete_file("file-old")


def test_the_sqlite_file_shrinks_when_files_are_deleted(tmp_path: Path) -> None:
    path = tmp_path / "opod.db"

    def on_disk() -> int:
        return sum(p.stat().st_size for p in tmp_path.glob("opod.db*") if not p.name.endswith("-shm"))

    with Store.open(f"sqlite:///{path}") as store:
        ids = [
            store.add_file(
                owner_key_id="k_a", project_id="", purpose="batch", filename="f", content=os.urandom(4 << 20)
            ).id
            for _ in range(4)
        ]
        full = on_disk()
        for file_id in ids:
            assert store.delete_file(file_id)
        assert on_disk() < full - (15 << 20), f"{on_disk()} bytes on disk of {full}"
        assert path.stat().st_size < 1 << 20


def test_a_line_is_answered_once_and_counted_once(store: Store) -> None:
    job = _job(store, 3)
    assert job.status == "in_progress" and job.total == 3 and job.id.startswith("batch_")
    assert [line.line for line in store.pending_lines(job.id)] == [1, 2, 3]
    assert store.answer_line(
        job.id, 1, ok=True, response_json='{"status_code": 200}', prompt_tokens=5, completion_tokens=7
    )
    assert not store.answer_line(job.id, 1, ok=False, response_json='{"status_code": 500}'), (
        "an answered line is not answered again"
    )
    assert store.answer_line(job.id, 2, ok=False, response_json='{"status_code": 400}')
    now = store.get_client_job(job.id)
    assert now is not None and (now.completed, now.failed, now.prompt_tokens, now.completion_tokens) == (1, 1, 5, 7)
    assert [line.line for line in store.pending_lines(job.id)] == [3]
    assert [(r.line, r.state) for r in store.job_lines(job.id)] == [(1, "answered"), (2, "failed"), (3, "pending")]


def test_answers_racing_for_one_line_count_it_once(store: Store) -> None:
    job = _job(store, 1)
    won: list[bool] = []
    threads = [
        threading.Thread(target=lambda: won.append(store.answer_line(job.id, 1, ok=True, response_json="{}")))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert won.count(True) == 1
    assert store.get_client_job(job.id).completed == 1  # type: ignore[union-attr]


def test_custom_ids_must_be_unique(store: Store) -> None:
    source = store.add_file(owner_key_id="k", project_id="", purpose="batch", filename="in", content=b"{}")
    twice = [JobLine(1, "same", "{}"), JobLine(2, "same", "{}")]
    with pytest.raises(InvalidInput, match="unique"):
        store.create_client_job(
            owner_key_id="k",
            project_id="",
            endpoint="/v1/embeddings",
            model="",
            input_file_id=source.id,
            completion_window=timedelta(hours=1),
            window_text="1h",
            metadata_json="{}",
            lines=twice,
        )
    assert store.list_client_jobs() == [], "nothing of the refused job is kept"


def test_a_lease_is_held_by_one_runner_until_it_lapses_and_its_owner_takes_it_back(store: Store) -> None:
    job = _job(store, 2)
    at = datetime.now(UTC)
    assert [j.id for j in store.claim_client_jobs("leader-a", lease=timedelta(seconds=30), at=at)] == [job.id]
    assert store.claim_client_jobs("leader-b", lease=timedelta(seconds=30), at=at) == [], "held by another"
    assert [j.id for j in store.claim_client_jobs("leader-a", lease=timedelta(seconds=30), at=at)] == [job.id], (
        "its own again"
    )
    later = at + timedelta(seconds=31)
    assert [j.id for j in store.claim_client_jobs("leader-b", lease=timedelta(seconds=30), at=later)] == [job.id], (
        "a lapsed lease moves"
    )


def test_a_job_created_leased_is_held_from_its_first_moment_until_its_lease_lapses(store: Store) -> None:
    job = _job(store, 2, leased_to=("leader-a", timedelta(seconds=30)))
    assert job.lease_owner == "leader-a" and job.lease_until == job.created_at + timedelta(seconds=30)
    assert store.claim_client_jobs("leader-b", lease=timedelta(seconds=30), at=job.created_at) == [], (
        "no other runner's look takes it"
    )
    later = job.created_at + timedelta(seconds=31)
    assert [j.id for j in store.claim_client_jobs("leader-b", lease=timedelta(seconds=30), at=later)] == [job.id]


def test_cancel_then_finish_writes_the_files_and_skips_the_lines_never_sent(store: Store) -> None:
    job = _job(store, 3, project="p_1")
    store.answer_line(job.id, 1, ok=True, response_json='{"status_code": 200, "body": {}}')
    cancelling = store.cancel_client_job(job.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    assert store.claim_client_jobs("r", lease=timedelta(seconds=30))[0].id == job.id, (
        "a cancelling job still needs its runner"
    )
    ended = store.finish_client_job(
        job.id, "cancelled", output=b'{"custom_id": "req-1"}\n', errors=None, skipped_error_json='{"code": "c"}'
    )
    assert ended.status == "cancelled" and ended.cancelled_at is not None and ended.error_file_id is None
    assert ended.output_file_id is not None and store.file_content(ended.output_file_id) == b'{"custom_id": "req-1"}\n'
    output = store.get_file(ended.output_file_id, key_id="k_other", project_id="p_1")
    assert output is not None and output.purpose == "batch_output", "the output belongs to the batch's key and project"
    assert [r.state for r in store.job_lines(job.id)] == ["answered", "skipped", "skipped"]
    assert store.cancel_client_job(job.id).status == "cancelled", "an ended job stays as it ended"
    assert store.finish_client_job(job.id, "completed", output=None, errors=None).status == "cancelled"
    assert store.claim_client_jobs("r", lease=timedelta(seconds=30)) == []


def test_an_expired_job_counts_its_unsent_lines_as_failed(store: Store) -> None:
    job = _job(store, 2)
    ended = store.finish_client_job(job.id, "expired", output=None, errors=b"{}\n")
    assert (ended.status, ended.failed, ended.completed) == ("expired", 2, 0) and ended.expired_at is not None


def test_a_failed_job_keeps_its_errors_and_no_lines(store: Store) -> None:
    source = store.add_file(owner_key_id="k", project_id="", purpose="batch", filename="in", content=b"nope")
    errors = json.dumps([{"code": "invalid_json_line", "line": 1, "message": "Line 1 is not JSON"}])
    job = store.create_client_job(
        owner_key_id="k",
        project_id="",
        endpoint="/v1/chat/completions",
        model="",
        input_file_id=source.id,
        completion_window=timedelta(hours=24),
        window_text="24h",
        metadata_json="{}",
        lines=[],
        errors_json=errors,
    )
    assert job.status == "failed" and job.failed_at is not None and json.loads(job.errors_json or "[]")[0]["line"] == 1
    assert store.claim_client_jobs("r", lease=timedelta(seconds=30)) == []


def test_listing_is_newest_first_by_key_status_and_cursor(store: Store) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    source = store.add_file(owner_key_id="k", project_id="", purpose="batch", filename="in", content=b"{}")
    ids = [
        store.create_client_job(
            owner_key_id="k" if i < 3 else "other",
            project_id="",
            endpoint="/v1/embeddings",
            model="",
            input_file_id=source.id,
            completion_window=timedelta(hours=1),
            window_text="1h",
            metadata_json="{}",
            lines=_lines(1),
            created_at=base + timedelta(minutes=i),
        ).id
        for i in range(4)
    ]
    assert [j.id for j in store.list_client_jobs(key_id="k")] == ids[2::-1]
    assert [j.id for j in store.list_client_jobs(key_id="k", after=ids[2], limit=1)] == [ids[1]]
    assert [j.id for j in store.list_client_jobs(status="in_progress")] == ids[::-1]
    assert store.list_client_jobs(status="completed") == []


def test_the_consoles_page_of_batches_is_filtered_and_cut_by_the_store(store: Store) -> None:
    made = [_job(store, 1, project="p_a"), _job(store, 1, project="p_a"), _job(store, 1, project="p_b")]
    newest_first = [j.id for j in reversed(made)]
    rows, total = store.page_client_jobs(limit=2)
    assert total == 3 and [j.id for j in rows] == newest_first[:2]
    rows, total = store.page_client_jobs(offset=2, limit=2)
    assert total == 3 and [j.id for j in rows] == newest_first[2:]
    rows, total = store.page_client_jobs(project_id="p_a")
    assert total == 2 and {j.id for j in rows} == {made[0].id, made[1].id}
    rows, total = store.page_client_jobs(contains=made[2].id[-8:].upper())
    assert total == 1 and rows[0].id == made[2].id, "any case"
    assert store.page_client_jobs(contains="%")[1] == 0, "the pattern's own characters are matched as written"
    assert store.page_client_jobs(contains="CHAT/COMPLETIONS")[1] == 3
    assert store.page_client_jobs(status="completed")[1] == 0
    with pytest.raises(InvalidInput, match="offset"):
        store.page_client_jobs(offset=-1)
