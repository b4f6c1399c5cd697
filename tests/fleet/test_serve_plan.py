"""Plans of a registry repository on a fleet with GPUs and without: what each way needs, where it fits, best first."""

from __future__ import annotations

from opod.contract.catalog import Architecture
from opod.fleet.placed import Held
from opod.fleet.serve_plan import plan
from opod.weights.choose import HubFile
from opod.weights.registry import Artifact, Repository
from tests.fleet.test_placement import NOW, node

GB = 10**9
BOTH = {"vllm": "0.11.1", "llamacpp": "b6000"}


def artifact(name: str, size: int, quant: str, bits: float, format: str = "gguf") -> Artifact:
    return Artifact(name, format, (HubFile(name, size),), quant, bits)


# An 8B model: 32 layers of 8 KV heads of 128, 128 KiB of KV cache a token.
REPO = Repository(
    repo="acme/eight-b",
    revision="c" * 40,
    gated=False,
    license="apache-2.0",
    architecture="llama",
    shape=Architecture(layers=32, heads=32, kv_heads=8, head_dim=128),
    trained_context=131072,
    params=8_000_000_000,
    artifacts=(
        artifact("eight-b-Q8_0.gguf", int(8.5 * GB), "Q8_0", 8.5),
        artifact("eight-b-Q4_K_M.gguf", int(4.9 * GB), "Q4_K_M", 4.89),
        artifact("original", 16 * GB, "bf16", 16.0, "safetensors"),
    ),
    projectors=(),
    files=(),
)
FLEET = [node("gpu-1", {"L40S": 2}, ram=64, versions=BOTH), node("cpu-1", ram=8, engine="llamacpp")]


def test_gguf_runs_on_a_gpu_first_then_on_cpus_with_the_preferred_quantisation_first() -> None:
    view, ways = plan(REPO, "gguf", 8192, FLEET, [], now=NOW)
    assert view.servable is True and view.context == 8192 and view.params == 8_000_000_000
    shown = [(o.artifact, o.engine, o.cpu, o.gpu_class, o.gpus_per_node, o.hosts) for o in view.options or []]
    assert shown == [
        ("eight-b-Q4_K_M.gguf", "llamacpp", False, "L40S", 1, 1),
        ("eight-b-Q8_0.gguf", "llamacpp", False, "L40S", 1, 1),
        ("eight-b-Q4_K_M.gguf", "llamacpp", True, None, None, 2),
        ("eight-b-Q8_0.gguf", "llamacpp", True, None, None, 1),
    ]
    q4_gpu = view.options[0]
    # Weights and 1 GiB of KV cache at 8192 tokens, a tenth more for buffers; a 48 GiB card holds it.
    assert q4_gpu.need_gb == round((4.9 * GB + 8192 * 131072) * 1.1 / 2**30, 4) and q4_gpu.have_gb == 48
    assert ways[2].profile.min_memory_gb == 7 and ways[0].profile.gpu_class == "L40S"
    assert [a.best.artifact if a.best else None for a in view.artifacts or []] == [
        "eight-b-Q8_0.gguf",
        "eight-b-Q4_K_M.gguf",
        None,
    ]


def test_what_holds_the_cards_now_makes_a_way_not_free_now() -> None:
    held = [Held("r1", "other", 0, "critical", gpus={"gpu-1": [0, 1]})]
    view, _ = plan(REPO, "safetensors", 8192, FLEET, held, now=NOW)
    option = (view.options or [])[0]
    assert (option.engine, option.gpu_class, option.gpus_per_node, option.hosts) == ("vllm", "L40S", 1, 1)
    assert option.free_now is False


def test_a_context_no_card_holds_takes_more_cards_then_is_not_servable() -> None:
    longer, _ = plan(REPO, "safetensors", 262144, FLEET, [], now=NOW)
    assert [o.gpus_per_node for o in longer.options or []] == [2]
    view, ways = plan(REPO, "safetensors", 1_000_000, FLEET, [], now=NOW)
    assert view.servable is False and ways == []
    assert view.reason is not None and view.reason.startswith("context: at 1000000 tokens"), view.reason


def test_safetensors_without_a_gpu_say_to_plan_a_gguf() -> None:
    view, _ = plan(REPO, "safetensors", 4096, [FLEET[1]], [], now=NOW)
    assert view.servable is False and "no node of this fleet has a GPU" in (view.reason or "")
