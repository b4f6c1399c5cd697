"""Downloading from a Hugging Face Hub (the loopback one in tests/support/hubserver.py)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import gguf
import pytest

from opod.weights import DigestMismatchError, WeightsError
from opod.weights import hub as hubapi
from opod.weights.hub import HubClient, HubError
from tests.support.hubserver import HubServer

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leftovers(folder: Path) -> list[str]:
    """Files a user would trip over: anything but the lock files."""
    return sorted(p.name for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


async def test_download_through_the_environment_places_the_file_and_reports_progress(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    seen: list[tuple[int, int | None]] = []
    path = await hubapi.download(REPO, FILE, None, tmp_path, progress=lambda done, total: seen.append((done, total)))
    assert path == tmp_path / "acme--tiny-GGUF@main" / FILE
    assert path.read_bytes() == served
    assert gguf.GGUFReader(path).fields["general.architecture"].contents() == "llama"
    assert seen[-1] == (len(served), len(served))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen), "progress never goes backwards"
    # The hub redirected to its CDN, as huggingface.co does.
    assert [r.origin for r in hub.requests_for(FILE)] == ["hub"]
    assert len([r for r in hub.requests if r.origin == "cdn"]) == 1
    assert leftovers(tmp_path) == [FILE, FILE + ".sha256"]


async def test_a_cut_connection_resumes_with_a_range_and_the_bytes_are_right(hub: HubServer, tmp_path: Path) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    hub.cut_after(FILE, 100_000)
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        path = await client.download(REPO, FILE, "main", tmp_path)
    assert sha256(path.read_bytes()) == sha256(served)
    asked = [r.range for r in hub.requests if r.origin == "cdn"]
    assert asked == [None, "bytes=100000-"]
    assert hub.requests_for(FILE)[1].range == "bytes=100000-"


async def test_a_part_left_by_an_interrupted_run_is_resumed_by_the_next(hub: HubServer, tmp_path: Path) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    hub.cut_after(FILE, 100_000, times=None)  # every try is cut (4 × 100 kB < 770 kB): the download gives up
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        with pytest.raises(WeightsError) as caught:
            await client.download(REPO, FILE, "main", tmp_path)
        message = str(caught.value)
        assert "run the same command again to resume" in message
        part = tmp_path / "acme--tiny-GGUF@main" / (FILE + ".part")
        kept = part.stat().st_size
        assert 0 < kept < len(served) and f"{kept} bytes are kept" in message
        assert not (tmp_path / "acme--tiny-GGUF@main" / FILE).exists()

        hub.clear_faults()
        hub.requests.clear()
        path = await client.download(REPO, FILE, "main", tmp_path)
    assert path.read_bytes() == served
    assert hub.requests_for(FILE)[0].range == f"bytes={kept}-"
    assert not part.exists()


async def test_a_server_that_ignores_range_restarts_the_part_cleanly(hub: HubServer, tmp_path: Path) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    folder = tmp_path / "acme--tiny-GGUF@main"
    folder.mkdir()
    (folder / (FILE + ".part")).write_bytes(b"stale bytes from some other download" * 100)
    hub.ignore_range = True
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        path = await client.download(REPO, FILE, "main", tmp_path)
    assert hub.requests_for(FILE)[0].range is not None, "the client did ask to resume"
    assert path.read_bytes() == served


async def test_a_transient_hub_error_is_retried(hub: HubServer, tmp_path: Path) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    hub.fail(FILE, 503, times=2)
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        path = await client.download(REPO, FILE, "main", tmp_path)
    assert path.read_bytes() == served
    assert len([r for r in hub.requests if r.origin == "cdn"]) == 3


async def test_a_lasting_hub_error_says_to_retry_later(hub: HubServer, tmp_path: Path) -> None:
    hub.add_tiny_gguf(REPO, FILE)
    hub.fail(FILE, 503, times=None)
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        with pytest.raises(HubError) as caught:
            await client.download(REPO, FILE, "main", tmp_path)
    assert caught.value.status == 503 and "retry later" in str(caught.value)
    assert leftovers(tmp_path) == []


async def test_two_downloads_of_one_file_at_once_fetch_it_once(hub: HubServer, tmp_path: Path) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        first, second = await asyncio.gather(
            client.download(REPO, FILE, "main", tmp_path), client.download(REPO, FILE, "main", tmp_path)
        )
    assert first == second and first.read_bytes() == served
    assert len([r for r in hub.requests if r.origin == "cdn"]) == 1


async def test_corrupt_bytes_are_refused_and_removed(hub: HubServer, tmp_path: Path) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    hub.corrupt(FILE)
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        with pytest.raises(DigestMismatchError) as caught:
            await client.download(REPO, FILE, "main", tmp_path)
    assert caught.value.expected == sha256(served)
    assert "removed" in str(caught.value) and "X-Linked-Etag" in str(caught.value)
    assert leftovers(tmp_path) == []


async def test_a_small_git_file_is_checked_against_its_git_object_id(hub: HubServer, tmp_path: Path) -> None:
    hub.add_file(REPO, "config.json", b'{"architectures": ["LlamaForCausalLM"]}')
    hub.corrupt("config.json", times=1)
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        with pytest.raises(DigestMismatchError, match="git object id"):
            await client.download(REPO, "config.json", "main", tmp_path)
        assert leftovers(tmp_path) == []
        path = await client.download(REPO, "config.json", "main", tmp_path)
    assert path.read_bytes() == b'{"architectures": ["LlamaForCausalLM"]}'


async def test_a_pin_that_the_hub_contradicts_downloads_nothing(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_tiny_gguf(REPO, FILE)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("OPOD_MODEL_SHA256", "ab" * 32)
    with pytest.raises(WeightsError) as caught:
        await hubapi.fetch_model(REPO, FILE, dest_dir=tmp_path)
    assert "abab" in str(caught.value) and "nothing was downloaded" in str(caught.value)
    assert not [r for r in hub.requests if r.origin == "cdn"]
    assert leftovers(tmp_path) == []


async def test_a_pin_that_matches_is_accepted_and_checked_again_on_a_cache_hit(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("OPOD_MODEL_SHA256", sha256(served).upper())
    path = await hubapi.fetch_model(REPO, FILE, dest_dir=tmp_path)
    assert path.read_bytes() == served
    path.write_bytes(b"damaged on disk since")
    again = await hubapi.fetch_model(REPO, FILE, dest_dir=tmp_path)
    assert again.read_bytes() == served, "a cached file that no longer matches the pin is fetched again"


async def test_revisions_are_cached_side_by_side_and_reused(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = hub.add_tiny_gguf(REPO, FILE, seed=1)
    v2 = hub.add_tiny_gguf(REPO, FILE, revision="v2", seed=2)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    first = await hubapi.download(REPO, FILE, None, tmp_path)
    monkeypatch.setenv("OPOD_MODEL_REVISION", "v2")
    second = await hubapi.download(REPO, FILE, None, tmp_path)
    assert first == tmp_path / "acme--tiny-GGUF@main" / FILE and first.read_bytes() == main
    assert second == tmp_path / "acme--tiny-GGUF@v2" / FILE and second.read_bytes() == v2
    # A commit id is a revision too.
    commit = hub.commit(REPO, "v2")
    third = await hubapi.download(REPO, FILE, commit, tmp_path)
    assert third == tmp_path / f"acme--tiny-GGUF@{commit}" / FILE and third.read_bytes() == v2
    count = len(hub.requests)
    assert await hubapi.download(REPO, FILE, "main", tmp_path) == first
    assert len(hub.requests) == count, "a cached revision is served without asking the hub"


async def test_missing_file_repo_and_revision_say_what_to_check(hub: HubServer, tmp_path: Path) -> None:
    hub.add_tiny_gguf(REPO, FILE)
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        with pytest.raises(HubError) as missing_file:
            await client.download(REPO, "nope.gguf", "main", tmp_path)
        with pytest.raises(HubError) as missing_revision:
            await client.download(REPO, FILE, "v9", tmp_path)
        with pytest.raises(HubError) as missing_repo:
            await client.list_files("acme/nothing-here", "main")
    assert missing_file.value.status == 404
    assert "has no file 'nope.gguf' at revision 'main'" in str(missing_file.value)
    assert missing_revision.value.status == 404 and "OPOD_MODEL_REVISION" in str(missing_revision.value)
    assert missing_repo.value.status == 401 and "check the name, or set HF_TOKEN" in str(missing_repo.value)
    assert leftovers(tmp_path) == []


async def test_a_gated_repo_needs_hf_token_which_never_reaches_the_cdn(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = hub.add_tiny_gguf(REPO, FILE)
    hub.require_token(REPO, "hf_secret", gated=True)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with pytest.raises(HubError) as anonymous:
        await hubapi.download(REPO, FILE, "main", tmp_path)
    assert anonymous.value.status == 401
    assert "gated" in str(anonymous.value) and "set HF_TOKEN" in str(anonymous.value)

    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubError) as refused:
        await hubapi.download(REPO, FILE, "main", tmp_path)
    assert refused.value.status == 403 and "has not been granted access" in str(refused.value)

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub.requests.clear()
    path = await hubapi.download(REPO, FILE, "main", tmp_path)
    assert path.read_bytes() == served
    assert hub.requests_for(FILE)[0].headers.get("Authorization") == "Bearer hf_secret"
    cdn = [r for r in hub.requests if r.origin == "cdn"]
    assert cdn and all("Authorization" not in r.headers for r in cdn)


async def test_a_repo_without_a_named_file_gets_its_q4_k_m_gguf(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_tiny_gguf(REPO, "tiny-Q8_0.gguf", seed=1, dim=128)
    chosen = hub.add_tiny_gguf(REPO, "tiny-Q4_K_M.gguf", seed=2)
    hub.add_tiny_gguf(REPO, "tiny-Q2_K.gguf", seed=3, dim=32)
    hub.add_file(REPO, "README.md", b"# tiny")
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    path = await hubapi.fetch_model(REPO, dest_dir=tmp_path)
    assert path.name == "tiny-Q4_K_M.gguf" and path.read_bytes() == chosen
    assert len([r for r in hub.requests if r.origin == "cdn"]) == 1, "only the chosen file is downloaded"


async def test_a_split_gguf_is_downloaded_whole_with_progress_over_all_parts(hub: HubServer, tmp_path: Path) -> None:
    parts = [hub.add_file(REPO, f"big-Q4_K_M-0000{i}-of-00003.gguf", bytes([i]) * (50_000 + i)) for i in (1, 2, 3)]
    seen: list[tuple[int, int | None]] = []
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        path = await client.fetch_model(REPO, dest_dir=tmp_path, progress=lambda d, t: seen.append((d, t)))
    assert path.name == "big-Q4_K_M-00001-of-00003.gguf"
    folder = path.parent
    assert [
        hashlib.sha256((folder / f"big-Q4_K_M-0000{i}-of-00003.gguf").read_bytes()).hexdigest() for i in (1, 2, 3)
    ] == parts
    total = 3 * 50_000 + 6
    assert seen[-1] == (total, total)


async def test_a_repo_without_gguf_is_a_clear_error(hub: HubServer, tmp_path: Path) -> None:
    hub.add_file("acme/plain", "model.safetensors", b"\0" * 100)
    hub.add_file("acme/plain", "config.json", b"{}")
    async with HubClient(endpoint=hub.url, backoff_s=0.01) as client:
        with pytest.raises(WeightsError) as caught:
            await client.fetch_model("acme/plain", dest_dir=tmp_path)
    message = str(caught.value)
    assert (
        "acme/plain@main has no GGUF model file" in message
        and "model.safetensors" in message
        and "source.file" in message
    )


async def test_listing_follows_pages_and_reports_lfs_digests(tmp_path: Path) -> None:
    async with HubServer(tree_page_size=2) as server:
        data = {f"dir/file{i}.gguf": bytes([i]) * 100 for i in range(5)}
        for name, content in data.items():
            server.add_file(REPO, name, content)
        async with HubClient(endpoint=server.url) as client:
            files = await client.list_files(REPO, "main")
            info = await client.model_info(REPO)
    assert sorted(f.path for f in files) == sorted(data)
    assert {f.path: f.sha256 for f in files} == {k: sha256(v) for k, v in data.items()}
    assert len([r for r in server.requests if "/tree/" in r.path]) >= 3
    assert info.sha == server.commit(REPO) and sorted(info.files) == sorted(data)


async def test_an_unreachable_hub_names_the_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.ports import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(WeightsError) as caught:
        await hubapi.list_files(REPO, "main")
    assert f"cannot reach the hub at {endpoint}" in str(caught.value) and "HF_ENDPOINT" in str(caught.value)


def test_the_sync_api_works_against_a_hub_on_its_own_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with HubServer().running_in_thread() as server:
        served = server.add_tiny_gguf(REPO, FILE)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        assert [f.path for f in hubapi.list_files_sync(REPO)] == [FILE]
        path = hubapi.fetch_model_sync(REPO, dest_dir=tmp_path)
    assert path.read_bytes() == served


def test_bad_names_and_settings_are_refused_with_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(WeightsError, match="repo: 'not a repo' is not a hub repository id"):
        hubapi.cache_path(tmp_path, "not a repo", "main", FILE)
    with pytest.raises(WeightsError, match="file: '../x' is not a path inside a repository"):
        hubapi.cache_path(tmp_path, REPO, "main", "../x")
    assert hubapi.cache_path(tmp_path, REPO, "refs/pr/1", FILE).parent.name == "acme--tiny-GGUF@refs%2Fpr%2F1"
    monkeypatch.setenv("OPOD_MODEL_SHA256", "xyz")
    with pytest.raises(WeightsError, match="OPOD_MODEL_SHA256: 'xyz' is not a SHA-256"):
        HubClient()
    monkeypatch.delenv("OPOD_MODEL_SHA256")
    monkeypatch.setenv("HF_ENDPOINT", "huggingface.co")
    with pytest.raises(WeightsError, match="HF_ENDPOINT: 'huggingface.co' is not an http"):
        HubClient()
