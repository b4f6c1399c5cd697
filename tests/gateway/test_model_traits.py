"""What the request rules know of a model (``Gateway.traits``): made once per model, made again when what it is made of changes."""

from __future__ import annotations

import json

from opod.catalog.loader import load_catalog
from opod.contract import nodeapi
from opod.contract.catalog import Entry
from opod.fleet.models import KnownModel
from opod.fleet.state import Fleet
from tests.gateway.test_relay import MODEL, Setup, setup  # noqa: F401  (the fixture)

BUNDLED = next(iter(load_catalog()))


def _entry(context: int) -> Entry:
    """A bundled entry whose window is ``context``."""
    return BUNDLED.model_copy(update={"context_window": context})


def _report(fleet: Fleet, context: int) -> None:
    fleet.heartbeat(
        nodeapi.Heartbeat(id="here", boot_id="b", loaded_models=[MODEL], slots=4, model_context={MODEL: context})
    )


def _join(fleet: Fleet, context: int) -> None:
    fleet.register(nodeapi.RegisterRequest(id="here", address="127.0.0.1:1", boot_id="b"), "t", nodeapi.Capabilities())
    _report(fleet, context)


async def test_the_catalog_s_window_and_the_workers_are_read_once_and_again_when_they_change(
    setup: Setup,  # noqa: F811
) -> None:
    gateway = setup.gateway
    _join(setup.fleet, 8192)
    known = KnownModel(id=MODEL, entry=_entry(4096), engine="sim")
    gateway.models.put(known)

    first = gateway.model_traits.of(MODEL)
    assert first.context == 4096, "the smaller of the catalog's window and the workers' is the limit"
    assert gateway.model_traits.of(MODEL) is first, "nothing changed: the traits made before"

    known.entry = _entry(2048)  # the model updated through the management API, in place
    assert gateway.model_traits.of(MODEL).context == 2048, "an updated entry is read at once"

    _report(setup.fleet, 1024)  # a worker restarted its engine with a smaller window
    setup.fleet._live.clear()  # as the fleet's short-lived answer expires by itself
    assert gateway.model_traits.of(MODEL).context == 1024

    gateway.models.remove(MODEL)
    assert gateway.model_traits.of(MODEL).context == 1024, "a model no longer in the catalog: the workers' window alone"


async def test_names_outside_the_catalog_are_not_kept(setup: Setup) -> None:  # noqa: F811
    for n in range(100):
        traits = setup.gateway.model_traits.of(f"no-such-model-{n}")
        assert traits.context is None and traits.capabilities is None
    assert json.dumps(sorted(setup.gateway.model_traits.kept)) == "[]", "a client's made-up names cost no memory"
