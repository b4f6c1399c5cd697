"""The worker's adapter table against a real simulator speaking vLLM's runtime LoRA API."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
import httpx
import pytest

from opod.catalog import load_catalog
from opod.contract import nodeapi
from opod.engines.registry import get_driver
from opod.sim import SimConfig, running
from opod.worker.adapters import Adapters, Attached, lora_flags
from opod.worker.engines import EngineManager
from opod.worker.refusals import AdapterRefused, LoadRefused
from opod.worker.run import wanted_adapters
from opod.worker.supervisor import Supervisor
from tests.support.engine_manager import load_and_serve

CONFIG = SimConfig(port=0, models=("base",), time_scale=0.0, enable_lora=True)


def listed(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]


class Engine:
    """Stands for the worker's view of the base model's engine: its URL, when it started, its LoRA rank."""

    def __init__(self, url: str) -> None:
        self.url, self.started, self.rank = url, 1.0, 16

    def of(self, model: str) -> tuple[str, float, int] | None:
        return (self.url, self.started, self.rank) if model == "base" else None


async def _with_table(engine: Engine, wanted=None, body=None):
    async with aiohttp.ClientSession() as session:
        table = Adapters(get_driver("sim"), lambda: session, engine.of, wanted)
        return await body(table)


def test_attach_serves_the_adapter_under_base_colon_name_and_detach_removes_it() -> None:
    with running(CONFIG) as sim:
        engine = Engine(sim.url)

        async def body(table: Adapters) -> None:
            answer = await table.attach(nodeapi.LoadAdapterRequest(base="base", name="sql", source="/a/sql", rank=8))
            assert (answer.status, answer.model) == ("ready", "base:sql")
            assert (
                listed(sim.url) == ["base", "base:sql"]
                and table.live() == ["base:sql"]
                and table.base_of("base:sql") == "base"
            )
            assert [a.to_json() for a in table.held()] == ['{"id":"base:sql","name":"sql","source":"/a/sql"}']
            assert (await table.detach(nodeapi.UnloadAdapterRequest(base="base", name="sql"))).status == "unloaded"
            assert listed(sim.url) == ["base"] and table.held() == []

        asyncio.run(_with_table(engine, body=body))


@pytest.mark.parametrize(
    ("request_", "status", "words"),
    [
        (
            nodeapi.LoadAdapterRequest(base="base", name="wide", source="/x", rank=64),
            409,
            "rank 64, but the engine serving 'base' was started for rank 16",
        ),
        (nodeapi.LoadAdapterRequest(base="other", name="x", source="/x"), 409, "'other' is not serving on this worker"),
        (nodeapi.LoadAdapterRequest(base="base", name="a:b", source="/x"), 400, "must not contain ':'"),
        (nodeapi.LoadAdapterRequest(base="base", name="x"), 400, "source: required"),
    ],
)
def test_refusals_say_why(request_: nodeapi.LoadAdapterRequest, status: int, words: str) -> None:
    with running(CONFIG) as sim:

        async def body(table: Adapters) -> None:
            with pytest.raises(AdapterRefused) as caught:
                await table.attach(request_)
            assert caught.value.status == status and words in str(caught.value)

        asyncio.run(_with_table(Engine(sim.url), body=body))


def test_an_engine_started_without_lora_is_told_how_to_turn_it_on() -> None:
    with running(CONFIG) as sim:
        engine = Engine(sim.url)
        engine.rank = 0

        async def body(table: Adapters) -> None:
            with pytest.raises(
                AdapterRefused, match="start it with LoRA on .the plan flag max_lora_rank, or OPOD_ADAPTERS."
            ) as caught:
                await table.attach(nodeapi.LoadAdapterRequest(base="base", name="x", source="/x"))
            assert caught.value.status == 501

        asyncio.run(_with_table(engine, body=body))


def test_a_restarted_engine_gets_its_adapters_again_and_the_wanted_ones_too() -> None:
    wanted = [
        nodeapi.Adapter(name="support", source="/a/support", rank=8),
        nodeapi.Adapter(name="huge", source="/a/huge", rank=128),
    ]
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(running(CONFIG))
        engine = Engine(first.url)

        async def body(table: Adapters) -> None:
            assert await table.reconcile(["base"])
            assert listed(first.url) == ["base", "base:support"], (
                "the wanted adapter that fits is attached; the rank-128 one is not"
            )
            await table.attach(nodeapi.LoadAdapterRequest(base="base", name="sql", source="/a/sql"))
            assert not await table.reconcile(["base"]), (
                "nothing to do, and a refused adapter is not retried on the same engine"
            )

            second = stack.enter_context(running(CONFIG))  # the supervisor's relaunch: a fresh engine, no adapters
            engine.url, engine.started = second.url, 2.0
            assert table.live() == [] and table.base_of("base:sql") is None
            assert await table.reconcile(["base"])
            assert sorted(listed(second.url)) == ["base", "base:sql", "base:support"]
            assert sorted(table.live()) == ["base:sql", "base:support"]

        asyncio.run(_with_table(engine, wanted, body))


def test_lora_flags_size_the_engine_for_the_largest_wanted_adapter() -> None:
    vllm, llamacpp = get_driver("vllm"), get_driver("llamacpp")
    assert lora_flags(vllm, {}, []) == {}
    assert lora_flags(vllm, {"ctx": 4}, [nodeapi.Adapter(name="a", source="s", rank=8)]) == {
        "ctx": 4,
        "max_lora_rank": 16,
    }
    assert lora_flags(vllm, {}, [nodeapi.Adapter(name="a", source="s", rank=40)])["max_lora_rank"] == 64
    assert (
        lora_flags(vllm, {"max_lora_rank": 256}, [nodeapi.Adapter(name="a", source="s", rank=40)])["max_lora_rank"]
        == 256
    )
    with pytest.raises(
        ValueError, match="the llamacpp engine cannot attach LoRA adapters at run time; use the vllm engine"
    ):
        lora_flags(llamacpp, {}, [nodeapi.Adapter(name="a", source="s")])
    with pytest.raises(ValueError, match="rank 1024 is larger than any rank vllm can be started for .at most 512."):
        lora_flags(vllm, {}, [nodeapi.Adapter(name="a", source="s", rank=1024)])


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("[{", "OPOD_ADAPTERS is not JSON"),
        ('{"name": "a"}', "OPOD_ADAPTERS must be a JSON list such as"),
        ('[{"name": "a", "rank": "big"}]', "OPOD_ADAPTERS[0]:"),
        ('[{"name": "a"}]', "OPOD_ADAPTERS[0]: needs a name (without ':') and a source"),
        ('[{"name": "a:b", "source": "/x"}]', "OPOD_ADAPTERS[0]: needs a name (without ':')"),
    ],
)
def test_a_bad_opod_adapters_is_refused_naming_the_element(
    monkeypatch: pytest.MonkeyPatch, value: str, words: str
) -> None:
    monkeypatch.setenv("OPOD_ADAPTERS", value)
    with pytest.raises(ValueError) as caught:
        wanted_adapters()
    assert words in str(caught.value)


def test_opod_adapters_is_read_as_the_contracts_adapter_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPOD_ADAPTERS", raising=False)
    assert wanted_adapters() == []
    monkeypatch.setenv(
        "OPOD_ADAPTERS",
        '[{"name": "support", "source": "/a/support", "rank": 64}, {"name": "legal", "source": "org/legal"}]',
    )
    assert wanted_adapters() == [
        nodeapi.Adapter(name="support", source="/a/support", rank=64),
        nodeapi.Adapter(name="legal", source="org/legal"),
    ]


async def test_the_engine_manager_serves_adapters_with_their_base_and_unloads_them_with_it(tmp_path: Path) -> None:
    manager = EngineManager(
        engine_id="sim",
        home=tmp_path,
        catalog=load_catalog(),
        supervisor=Supervisor(),
        flags={"time_scale": 0},
        adapters=[nodeapi.Adapter(name="support", source="/a/support", rank=8)],
    )
    try:
        assert manager.flags["max_lora_rank"] == 16
        engine = await load_and_serve(manager, "sim-model")
        await manager.reconcile_adapters()  # what the agent does before each heartbeat
        assert manager.loaded_models() == ["sim-model", "sim-model:support"]
        assert manager.serving("sim-model:support") is engine
        assert manager.engine_urls() == {"sim-model": engine.base_url, "sim-model:support": engine.base_url}

        await manager.adapters.attach(nodeapi.LoadAdapterRequest(base="sim-model", name="legal", source="/a/legal"))
        with pytest.raises(
            LoadRefused, match=r"adapters are attached to 'sim-model' on this worker \(sim-model:legal\)"
        ) as caught:
            await manager.unload(nodeapi.UnloadModelRequest(id="sim-model"))
        assert caught.value.status == 409
        assert (await manager.unload(nodeapi.UnloadModelRequest(id="sim-model:legal"))).status == "unloaded"
        # OPOD_ADAPTERS' adapter does not hold its base: it goes with it, and comes back with it.
        assert (await manager.unload(nodeapi.UnloadModelRequest(id="sim-model"))).status == "unloaded"
        assert manager.loaded_models() == [] and manager.adapters.held() == []
    finally:
        await manager.stop_all()


def test_a_local_adapters_own_rank_is_read_when_the_request_states_none(tmp_path: Path) -> None:
    adapter = tmp_path / "wide"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 64, "lora_alpha": 16}')
    with running(CONFIG) as sim:

        async def body(table: Adapters) -> None:
            with pytest.raises(
                AdapterRefused,
                match="adapter 'wide' has rank 64, but the engine serving 'base' was started for rank 16",
            ):
                await table.attach(nodeapi.LoadAdapterRequest(base="base", name="wide", source=str(adapter)))
            (adapter / "adapter_config.json").write_text('{"r": 8}')
            assert (
                await table.attach(nodeapi.LoadAdapterRequest(base="base", name="wide", source=str(adapter)))
            ).status == "ready"

        asyncio.run(_with_table(Engine(sim.url), body=body))


async def test_an_adapter_on_a_base_whose_name_holds_a_colon_unloads_by_its_model_id(tmp_path: Path) -> None:
    # Ollama-style ids carry a tag ("llama3:8b"); the adapter is served as "llama3:8b:support".
    manager = EngineManager(
        engine_id="sim", home=tmp_path, catalog=load_catalog(), supervisor=Supervisor(), flags={"time_scale": 0}
    )
    try:
        manager.adapters.attached["llama3:8b:support"] = Attached(
            "llama3:8b", "support", "/a/support", engine_start=1.0
        )
        answer = await manager.unload(nodeapi.UnloadModelRequest(id="llama3:8b:support"))
        assert (answer.status, answer.model) == ("unloaded", "llama3:8b:support") and manager.adapters.held() == []
    finally:
        await manager.stop_all()


async def test_a_models_own_adapters_are_read_first_go_with_it_and_come_back_with_it(tmp_path: Path) -> None:
    adapter = tmp_path / "sql"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8, "base_model_name_or_path": "acme/base"}')
    manager = EngineManager(
        engine_id="sim", home=tmp_path, catalog=load_catalog(), supervisor=Supervisor(), flags={"max_lora_rank": 16}
    )
    try:
        await load_and_serve(manager, "sim-model")
        asked = nodeapi.LoadAdapterRequest(base="sim-model", name="sql", source=str(adapter))
        read = manager.adapters.check(asked)
        assert (read.rank, read.base_model, read.max_rank) == (8, "acme/base", 16)
        assert manager.loaded_models() == ["sim-model"], "reading attaches nothing"

        await manager.adapters.attach(asked.model_copy(update={"definition": True}))
        assert manager.loaded_models() == ["sim-model", "sim-model:sql"]
        # The model's own adapter does not hold its base: it goes with it.
        assert (await manager.unload(nodeapi.UnloadModelRequest(id="sim-model"))).status == "unloaded"

        # A load names the model's list as it is now: what it lists comes up with the base, and only that.
        await load_and_serve(manager, "sim-model", adapters=[nodeapi.Adapter(name="sql", source=str(adapter))])
        await manager.reconcile_adapters()
        assert manager.loaded_models() == ["sim-model", "sim-model:sql"]
        await manager.adapters.detach(nodeapi.UnloadAdapterRequest(base="sim-model", name="sql"))
        assert manager.adapters.defined == {"sim-model": {}}, "taken off the list, it is not attached again"
        assert manager.reconcile_adapters() is None and manager.loaded_models() == ["sim-model"]
    finally:
        await manager.stop_all()
