"""Sharded models: one GGUF split over several workers with llama.cpp's own RPC runtime.

A **gang** is N RPC parts plus one coordinator:

- a **part** is llama.cpp's RPC server (``rpc-server -H <host> -p <port>``)
  on a worker, started through the worker's process API
  (``/v1/process/start``) and ready when its port accepts a connection. Parts
  go to distinct live workers; part ``i`` takes port ``rpc_port_base + i``
  from the catalog's ``sharding`` block, and when that port is taken on the
  worker the next tries are one gang-width further (found by trying: the RPC
  server prints "Failed to create server socket" and exits). A part binds
  loopback when its worker is reached over loopback, every interface
  otherwise: the RPC protocol has no authentication, so parts belong on a
  private network.
- the **coordinator** is an ordinary model load (``/v1/model/load``) on one
  worker with ``flags: {"rpc": "host1:port1,host2:port2"}``: the worker starts
  llama-server with ``--rpc`` on its own free port, so the model is served
  through that worker's data path and shows up in its heartbeat like any
  model; the router sends requests there with no special case. The
  catalog's ``coordinator_port`` is therefore not used: the worker picks its
  engine's port. It goes to ``OPOD_COORDINATOR_NODE`` when the lead passes one
  (``local`` = the leader's own worker), else to the live llama.cpp worker
  with the most memory; that worker also takes part 0 when it can.

llama-server that cannot reach an ``--rpc`` endpoint logs "Failed to connect
to …" and carries on without it, so a coordinator counts as formed only when
its process runs, its log names no unreachable part, and its worker's
heartbeat lists the model.

Weights: when the catalog source is a file on the leader, the GGUF is sent to
the coordinator's worker (``HEAD /v1/process/file`` by name and sha256, else a
streamed ``POST /v1/process/upload`` that the worker keeps only when the digest
matches) and loaded by the path the worker reports. Parts need no file: the
coordinator sends each its tensors. Other sources (Hugging Face, a package
index) are fetched by the coordinator's worker as any load is.

Operations (:class:`ShardManager`, called by the lead's ``/admin/v1/shards``
routes): ``create``, ``list``, ``delete`` (every gang of a model),
``delete_gang``. A failed create stops every part it started and unloads the
coordinator before it raises. Each change emits a lifecycle event through
``emit(type, subject, data)``: ``shard.created``, ``shard.healed``,
``shard.heal_failed``, ``shard.removed`` (subject = the model id).

Healing (:mod:`opod.shards.healing`, run by the lead with
``ShardManager.run_healer``): a part whose worker is gone or whose process
ended is started again elsewhere and the coordinator restarted with the new
RPC list; ``shard.heal_failed`` says why when it cannot be done.

Records are in memory; ``ShardManager.to_json`` / ``from_json`` let the lead
keep them across restarts.

Modules: :mod:`~opod.shards.records` (the gang record and the request and
response shapes), :mod:`~opod.shards.planning` (plan and placement, pure),
:mod:`~opod.shards.calls` (calls to one worker), :mod:`~opod.shards.distribute`
(the GGUF to the coordinator's worker), :mod:`~opod.shards.gangs` (the records
and the steps creating and healing share), :mod:`~opod.shards.manager` (the
operations), :mod:`~opod.shards.healing`. Where the RPC server binary comes
from: :mod:`opod.engines.rpc_binary`.
"""

from opod.shards.calls import Timing
from opod.shards.errors import ShardError
from opod.shards.gangs import Gangs
from opod.shards.healing import SHARD_HEAL_FAILED, SHARD_HEALED
from opod.shards.manager import SHARD_CREATED, SHARD_REMOVED, ShardManager
from opod.shards.records import (
    CreateShards,
    Gang,
    GangList,
    GangState,
    Part,
    ProcessState,
    RemovedGangs,
)

__all__ = [
    "SHARD_CREATED",
    "SHARD_HEALED",
    "SHARD_HEAL_FAILED",
    "SHARD_REMOVED",
    "CreateShards",
    "Gang",
    "GangList",
    "GangState",
    "Gangs",
    "Part",
    "ProcessState",
    "RemovedGangs",
    "ShardError",
    "ShardManager",
    "Timing",
]
