"""What a worker runs for the replica the reconciler gave it: devices, and across nodes the engine's own runtime.

No GPU here: the command lines vLLM's Ray cluster and SGLang's launcher get are
checked as argv, the way the worker would start them.
"""

from __future__ import annotations

import pytest

from opod.engines.base import LaunchSpec
from opod.engines.registry import get_driver
from opod.worker import multinode
from opod.worker.model_engine import ModelEngine


def spec(**flags) -> LaunchSpec:
    return LaunchSpec(model_id="big", model="org/big", port=8000, flags=flags)


def test_a_single_node_replica_has_no_ranks():
    assert multinode.ranks_of(0, None) is None
    assert multinode.ranks_of(0, ["10.0.0.1:8081"]) is None
    with pytest.raises(ValueError, match="rank: 2"):
        multinode.ranks_of(2, ["a:1", "b:1"])


def test_devices_become_cuda_visible_devices_beside_the_profile_env():
    assert multinode.device_env([2, 3], {"NCCL_DEBUG": "INFO"}) == {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert multinode.device_env(None, None) == {}


def test_replica_flags_carry_tp_pp_where_the_driver_reads_them_and_the_profile_args():
    vllm = get_driver("vllm")
    flags = multinode.replica_flags({"extra": ["--a"]}, vllm.flag_keys, tp=4, pp=2, args=["--b", "1"])
    assert flags == {"extra": ["--a", "--b", "1"], "tp": 4, "pp": 2}
    argv = vllm.argv(spec(**flags))
    assert (
        argv[argv.index("--tensor-parallel-size") + 1] == "4"
        and argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    )
    assert argv[-3:] == ["--a", "--b", "1"]
    sim = get_driver("sim")
    assert "tp" not in multinode.replica_flags({}, sim.flag_keys, tp=2, pp=0, args=None)


def test_vllm_across_nodes_runs_on_a_ray_cluster():
    head = multinode.ranks_of(0, ["10.0.0.1:8081", "10.0.0.2:8081"])
    follower = multinode.ranks_of(1, ["10.0.0.1:8081", "10.0.0.2:8081"])
    assert head is not None and follower is not None
    assert multinode.ray_head_argv("/venv/bin/python") == [
        "/venv/bin/python",
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--port",
        "6379",
        "--block",
    ]
    assert multinode.ray_worker_argv(follower, "/venv/bin/python")[-3:] == ["--address", "10.0.0.1:6379", "--block"]
    assert multinode.vllm_rank0_args(head) == ["--distributed-executor-backend", "ray"]
    assert multinode.vllm_rank0_env(head) == {"RAY_ADDRESS": "127.0.0.1:6379"}


def test_sglang_across_nodes_uses_its_own_launcher_flags_on_every_rank():
    sglang = get_driver("sglang")
    for rank in (0, 1):
        ranks = multinode.ranks_of(rank, ["10.0.0.1:8081", "10.0.0.2:8081"])
        assert ranks is not None
        argv = sglang.argv(spec(tp=2)) + multinode.sglang_args(ranks)
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.1:20000"
        assert argv[argv.index("--tp-size") + 1] == "2"


def test_only_rank_0_serves():
    follower = ModelEngine(model_id="big", driver=get_driver("sim"), ranks=multinode.ranks_of(1, ["a:1", "b:1"]))
    head = ModelEngine(model_id="big", driver=get_driver("sim"), ranks=multinode.ranks_of(0, ["a:1", "b:1"]))
    assert follower.follower and not head.follower
