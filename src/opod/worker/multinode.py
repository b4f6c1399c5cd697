"""What one rank of a replica across nodes runs: the engine's own distributed runtime, never a home-made one.

The leader's load request names this node's ``rank`` and every rank's worker
address in ``peers`` (rank 0 first; rank 0 serves). Per engine:

* vLLM runs on a Ray cluster: rank 0 starts the Ray head (``ray start --head``)
  and then vLLM with ``--distributed-executor-backend ray``; every other rank
  joins the head (``ray start --address HEAD:PORT --block``) and serves nothing.
* SGLang's own launcher: every rank runs ``sglang.launch_server`` with
  ``--nnodes N --node-rank R --dist-init-addr HEAD:PORT``; only rank 0 answers HTTP.
* llama.cpp splits by RPC, which opod's gangs already do (``opod.shards``).
* The simulator: rank 0 serves alone, the other ranks only record what they were given.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RAY_PORT = 6379
"""The Ray head's GCS port on rank 0's node."""
SGLANG_DIST_PORT = 20000
"""SGLang's ``--dist-init-addr`` port on rank 0's node."""


@dataclass(frozen=True, slots=True)
class Ranks:
    rank: int
    peers: tuple[str, ...]
    """Every rank's worker address (``host:port``), rank 0 first."""

    @property
    def nodes(self) -> int:
        return len(self.peers)

    @property
    def head_host(self) -> str:
        address = self.peers[0]
        return address.rsplit(":", 1)[0].strip("[]") if ":" in address else address


def ranks_of(rank: int, peers: list[str] | None) -> Ranks | None:
    """The replica's ranks when it spans nodes; ``None`` for a replica on one node."""
    if not peers or len(peers) < 2:
        return None
    if not 0 <= rank < len(peers):
        raise ValueError(f"rank: {rank} is not one of the replica's {len(peers)} ranks (0 to {len(peers) - 1})")
    return Ranks(rank, tuple(peers))


def ray_head_argv(python: str = "") -> list[str]:
    return [
        python or sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--port",
        str(RAY_PORT),
        "--block",
    ]


def ray_worker_argv(ranks: Ranks, python: str = "") -> list[str]:
    return [
        python or sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--address",
        f"{ranks.head_host}:{RAY_PORT}",
        "--block",
    ]


def vllm_rank0_args(ranks: Ranks) -> list[str]:
    """Added to rank 0's vLLM command line: its workers on the other nodes come from the Ray cluster."""
    return ["--distributed-executor-backend", "ray"]


def vllm_rank0_env(ranks: Ranks) -> dict[str, str]:
    return {"RAY_ADDRESS": f"127.0.0.1:{RAY_PORT}"}


def sglang_args(ranks: Ranks) -> list[str]:
    """Added to every rank's SGLang command line."""
    return [
        "--nnodes",
        str(ranks.nodes),
        "--node-rank",
        str(ranks.rank),
        "--dist-init-addr",
        f"{ranks.head_host}:{SGLANG_DIST_PORT}",
    ]


def device_env(devices: list[int] | None, env: Mapping[str, str] | None) -> dict[str, str]:
    """The engine's environment from its replica: the profile's ``env``, and its devices as ``CUDA_VISIBLE_DEVICES``."""
    out = dict(env or {})
    if devices:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
    return out


def replica_flags(
    flags: Mapping[str, Any], reads: frozenset[str], *, tp: int, pp: int, args: list[str] | None
) -> dict[str, Any]:
    """The worker's flags with the replica's tensor and pipeline parallel (where the driver reads them) and extra args."""
    out = dict(flags)
    if tp and "tp" in reads:
        out["tp"] = tp
    if pp and "pp" in reads:
        out["pp"] = pp
    if args:
        extra = out.get("extra")
        out["extra"] = (list(extra) if isinstance(extra, list) else []) + list(args)
    return out
