"""``[train] shard = "fsdp"`` in the wiring: refused without servers, held-out completions must carry
the trainer's version, and every publish gathers the sharded weights first."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from rlvr.config.run import run_config_from_dict
from rlvr.errors import BackendError, ConfigError
from rlvr.types import SamplingParams
from rlvr.wiring.scale.sharding import GatheringLane, ServedVersionCheck, publishing_policy


def test_fsdp_with_the_in_process_engine_is_refused_naming_both_keys():
    with pytest.raises(ConfigError) as err:
        run_config_from_dict({"train": {"shard": "fsdp"}})
    assert "train.shard" in str(err.value) and "sampler.backend" in str(err.value)
    cfg = run_config_from_dict({"train": {"shard": "fsdp"}, "sampler": {"backend": "http", "replicas": 2}})
    assert cfg.train.shard == "fsdp"
    assert run_config_from_dict({}).train.shard == "replicate"


def test_tensor_parallel_needs_fsdp_shards_beside_it():
    with pytest.raises(ConfigError, match=r"train.tensor_parallel = 2 splits layers beside FSDP2's shards: set "
                                          r"train.shard = 'fsdp'"):
        run_config_from_dict({"train": {"tensor_parallel": 2}})
    cfg = run_config_from_dict({"train": {"shard": "fsdp", "tensor_parallel": 2}, "sampler": {"backend": "http"}})
    assert cfg.train.tensor_parallel == 2


@dataclasses.dataclass
class Out:
    version: int | None


class Server:
    def __init__(self, version):
        self.served = version

    async def generate(self, prompt_ids, params, *, seed):
        return Out(self.served)

    def describe(self):
        return {"type": "pool"}


def test_a_held_out_completion_from_another_version_fails_naming_both():
    trainer_version = [3]
    checked = ServedVersionCheck(Server(3), lambda: trainer_version[0])
    params = SamplingParams(max_tokens=4, temperature=0.0)
    assert asyncio.run(checked.generate([1, 2], params, seed=0)).version == 3
    trainer_version[0] = 4  # trained, but the server was not brought up to date
    with pytest.raises(BackendError, match="policy version 3, but the trainer holds version 4"):
        asyncio.run(checked.generate([1, 2], params, seed=0))
    assert checked.describe()["sampler"] == {"type": "pool"}


def test_every_publish_gathers_first_and_the_lanes_write_from_rank_0s_copy():
    calls = []

    class Trainer:
        trainer = type("Sharded", (), {"full": "gathered copy"})()

        def gather(self):
            calls.append("gather")

    class Lane:
        def __call__(self, version):
            calls.append(f"publish {version}")
            return version

        def describe(self):
            return {"lane": "lora_hot_load"}

    lane = GatheringLane(Trainer(), Lane())
    assert lane(5) == 5 and calls == ["gather", "publish 5"]
    assert lane.describe()["lane"] == "lora_hot_load" and "sharded" in lane.describe()["gathered_from"]
    assert publishing_policy(Trainer(), "live") == "gathered copy"
    assert publishing_policy(object(), "live") == "live"
