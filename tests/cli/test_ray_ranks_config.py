"""``rlvr train --nproc N`` with ``[cluster] backend = "ray"``: what is refused before a cluster
starts, where the ``trainer`` placement group puts the ranks, and the keys (no Ray started)."""

from __future__ import annotations

import pytest

from rlvr.config.run import run_config_from_dict
from rlvr.errors import ConfigError, UsageError
from rlvr.wiring.scale.ray_ranks import check, placement

RAY = {"cluster": {"backend": "ray"}}


def test_nproc_below_one_and_nproc_inside_torchrun_are_refused():
    cfg = run_config_from_dict(RAY)
    with pytest.raises(UsageError, match=r"--nproc 0: give the number of trainer ranks"):
        check(cfg, 0, env={})
    with pytest.raises(UsageError, match=r"inside torchrun: torchrun already started the ranks; drop --nproc"):
        check(cfg, 2, env={"WORLD_SIZE": "2"})
    check(cfg, 2, env={})  # a plain process asking for 2 ranks on Ray: fine


def test_more_cuda_ranks_than_the_nodes_gpus_are_refused_naming_both():
    cfg = run_config_from_dict({**RAY, "model": {"device": "cuda"}})
    with pytest.raises(ConfigError, match=r"--nproc 3 with model.device = 'cuda': .* GPU r of this node .* it has 2"):
        check(cfg, 3, env={}, gpus=2)
    check(cfg, 2, env={}, gpus=2)


def test_nccl_ranks_are_packed_on_rank_0s_node_and_gloo_ranks_follow_the_configured_placement():
    gpu = run_config_from_dict({**RAY, "model": {"device": "cuda"}})
    strategy, resources = placement(3, gpu, "10.0.0.5")
    assert strategy == "STRICT_PACK" and set(resources) == {"node:10.0.0.5"}
    assert 3 * resources["node:10.0.0.5"] <= 1.0  # every bundle fits on that node's one node resource
    cpu = run_config_from_dict({"cluster": {"backend": "ray", "placement": "pack"}})
    assert placement(3, cpu, "10.0.0.5") == (None, {})  # None: RayCluster uses cluster.placement


@pytest.mark.parametrize("key", ["trainer_cpus", "rank_timeout_s"])
def test_the_trainer_rank_keys_are_checked_at_load(key):
    assert getattr(run_config_from_dict(RAY).cluster, key) > 0
    with pytest.raises(ConfigError, match=key):
        run_config_from_dict({"cluster": {"backend": "ray", key: 0}})


def test_the_command_refuses_nproc_with_ray_inside_torchrun_before_anything_is_written(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    from rlvr.cli.commands import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--out", str(tmp_path / "run"), "--nproc", "2", "--cluster.backend=ray"]) == 2
    assert "--nproc with cluster.backend = 'ray' inside torchrun" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
