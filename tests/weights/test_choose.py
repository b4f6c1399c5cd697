"""Which GGUF of a repository is served when the catalog names no file."""

from __future__ import annotations

import pytest

from opod.weights import WeightsError
from opod.weights.choose import HubFile, choose_gguf


def files(*spec: tuple[str, int]) -> list[HubFile]:
    return [HubFile(path, size) for path, size in spec]


def test_q4_k_m_wins_over_smaller_and_larger_quantizations() -> None:
    choice = choose_gguf(files(("m-Q2_K.gguf", 10), ("m-Q4_K_M.gguf", 40), ("m-Q8_0.gguf", 80), ("m-f16.gguf", 160)))
    assert choice.first.path == "m-Q4_K_M.gguf"


def test_the_quantization_name_is_matched_in_any_case_and_the_smallest_q4_k_m_wins() -> None:
    choice = choose_gguf(files(("sub/m.q4_k_m.gguf", 40), ("sub/m-imatrix-Q4_K_M.gguf", 39), ("m-Q2_K.gguf", 10)))
    assert choice.first.path == "sub/m-imatrix-Q4_K_M.gguf"


def test_without_q4_k_m_the_smallest_gguf_wins_and_projectors_are_not_models() -> None:
    choice = choose_gguf(files(("mmproj-f16.gguf", 1), ("m-Q8_0.gguf", 80), ("m-Q5_K_S.gguf", 50), ("README.md", 0)))
    assert choice.first.path == "m-Q5_K_S.gguf"


def test_a_split_model_counts_as_one_choice_only_when_complete() -> None:
    parts = [(f"m-Q4_K_M-0000{i}-of-00003.gguf", 30) for i in (3, 1, 2)]
    choice = choose_gguf(files(*parts, ("m-Q8_0.gguf", 70)))
    assert [f.path for f in choice.files] == [f"m-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert choice.size == 90
    incomplete = choose_gguf(files(*parts[:2], ("m-Q8_0.gguf", 70)))
    assert incomplete.first.path == "m-Q8_0.gguf"


def test_a_repository_without_gguf_names_its_files_and_the_remedy() -> None:
    with pytest.raises(WeightsError) as caught:
        choose_gguf(files(("model.safetensors", 10), ("mmproj-model-f16.gguf", 5)), "acme/plain@main")
    message = str(caught.value)
    assert message.startswith("acme/plain@main has no GGUF model file")
    assert "model.safetensors" in message and "source.file" in message
