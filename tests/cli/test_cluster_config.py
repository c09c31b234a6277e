"""``[cluster]``: validated at load, the CPUs a run's actors reserve, and Ray missing named (no Ray started)."""

from __future__ import annotations

import sys

import pytest

from rlvr.config.run import run_config_from_dict
from rlvr.errors import ConfigError, MissingExtraError
from rlvr.wiring.scale.cluster import cluster, cluster_record, cpus_needed, on_ray


def test_the_default_is_local_processes_and_the_record_says_so():
    cfg = run_config_from_dict({})
    assert cfg.cluster.backend == "local" and not on_ray(cfg)
    assert cluster_record(cfg) == {"backend": "local"}


@pytest.mark.parametrize(("section", "match"), [
    ({"address": "auto"}, r"cluster.address is for a Ray cluster: set cluster.backend = 'ray'"),
    ({"num_cpus": 4}, r"cluster.num_cpus is for a Ray cluster"),
    ({"backend": "ray", "address": "auto", "num_cpus": 4}, r"num_cpus sizes a local Ray cluster .* drop num_cpus"),
    ({"backend": "ray", "sampler_cpus": 0}, r"sampler_cpus"),
    ({"backend": "ray", "max_restarts": -2}, r"max_restarts"),
    ({"backend": "ray", "placement": "strict"}, r"placement"),
    ({"backend": "slurm"}, r"backend"),
    ({"backend": "ray", "nodes": 3}, r"nodes"),
])
def test_a_bad_cluster_section_is_refused_naming_the_key(section, match):
    with pytest.raises(ConfigError, match=match):
        run_config_from_dict({"cluster": section})


def test_the_cpus_reserved_count_the_servers_rlvr_starts_and_every_sections_reward_workers():
    ray = {"backend": "ray", "sampler_cpus": 2.0, "reward_cpus": 0.5}
    cfg = run_config_from_dict({"cluster": ray, "sampler": {"backend": "http", "replicas": 3},
                                "task": {"reward_workers": 2}})
    assert cpus_needed(cfg) == 3 * 2.0 + 2 * 0.5
    theirs = run_config_from_dict({"cluster": ray, "sampler": {"backend": "http", "url": ["http://a/v1", "http://b/v1"]},
                                   "task": {"reward_workers": 2}})
    assert cpus_needed(theirs) == 1.0  # servers the user runs are not the cluster's to place
    envs = run_config_from_dict({"cluster": ray, "envs": {"a": {"reward_workers": 1}, "b": {"reward_workers": 3}}})
    assert cpus_needed(envs) == 4 * 0.5  # in-process sampling: no server actors


def test_without_ray_installed_the_ray_backend_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    for name in [m for m in sys.modules if m.startswith("rlvr.backends.cluster.ray")]:
        monkeypatch.delitem(sys.modules, name)
    cfg = run_config_from_dict({"cluster": {"backend": "ray"}, "task": {"reward_workers": 1}})
    with pytest.raises(MissingExtraError, match=r"cluster.backend = 'ray' needs Ray .*pip install 'rlvr\[ray\]'"):
        cluster(cfg)


def test_a_saved_config_from_before_the_section_loads_as_local():
    cfg = run_config_from_dict(run_config_from_dict({}).model_dump(mode="json") | {"cluster": {}})
    assert cfg.cluster.backend == "local"
    old = {k: v for k, v in run_config_from_dict({}).model_dump(mode="json").items() if k != "cluster"}
    assert run_config_from_dict(old).cluster.backend == "local"


@pytest.mark.parametrize(("data", "match"), [
    ({"cluster": {"rollout_workers": 2}, "sampler": {"backend": "http"}},
     r"cluster.rollout_workers are Ray actors: set cluster.backend = 'ray', or start `rlvr rollout-worker`"),
    ({"cluster": {"rollout_urls": ["127.0.0.1:8300"]}, "sampler": {"backend": "http"}},
     r"list each worker once, as http://host:port"),
    ({"cluster": {"backend": "ray", "rollout_workers": 1}},
     r"reach the policy through its server: set sampler.backend = 'http' \(rlvr serve\) or 'vllm'"),
    ({"cluster": {"rollout_urls": ["http://h:1"]}, "sampler": {"backend": "vllm_colocate"}},
     r"reach the policy through its server: .* \(not 'vllm_colocate'\)"),
    ({"cluster": {"rollout_urls": ["http://h:1"]}, "sampler": {"backend": "http"},
      "task": {"agent": "tutor.py:run"}},
     r"task.agent plays episodes through the run's recording proxy, which remote rollout workers do not reach"),
    ({"cluster": {"rollout_urls": ["http://h:1"]}, "sampler": {"backend": "http"},
      "task": {"data": "rows.jsonl", "rewards": ["rm:scorer"]}},
     r"task.rewards has a reward model \('rm:scorer'\); a remote rollout worker builds"),
    ({"cluster": {"rollout_urls": ["http://h:1"]}, "sampler": {"backend": "http"},
      "algo": {"type": "sft", "sampling": {"source": {"name": "t", "base_url": "http://t/v1"}}}},
     r"algo.sampling.source samples a frozen endpoint, which remote rollout workers do not run"),
    ({"cluster": {"rollout_key_file": "w.url.key"}, "sampler": {"backend": "http"}},
     r"cluster.rollout_key_file is the key of the workers at cluster.rollout_urls: list them or drop it"),
])
def test_remote_rollout_workers_are_refused_where_they_cannot_work(data, match):
    with pytest.raises(ConfigError, match=match):
        run_config_from_dict(data)


def test_rollout_actors_count_in_the_cpus_reserved():
    cfg = run_config_from_dict({"cluster": {"backend": "ray", "rollout_workers": 3, "rollout_cpus": 0.5},
                                "sampler": {"backend": "http", "url": "http://s/v1"}})
    assert cpus_needed(cfg) == 3 * 0.5


def test_a_hub_environment_played_by_an_agent_is_refused_remote_workers_naming_it():
    from rlvr.wiring.scale.rollout_workers import check_remote

    section = run_config_from_dict({"task": {"env": "openenv:echo_env:EchoEnv"}}).task
    check_remote(section, None, None)  # no agent: the worker builds the rollout function
    with pytest.raises(ConfigError, match=r"task.env='openenv:echo_env:EchoEnv' \(a hub environment\) is played "
                                          r"by an agent"):
        check_remote(section, lambda base_url, row: None, None)
