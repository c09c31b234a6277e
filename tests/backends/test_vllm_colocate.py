"""vLLM inside the training process, without vLLM: the request mapping, the engine's batching and
weight handover over a stand-in ``LLM``, the merged LoRA weights, the lane's checks, sleeping while
training, and the refusals of the config. The real engine runs in tests/e2e/test_vllm_colocate_runs.py."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.sample.vllm_engine import LOGPROB_FLOOR, ColocatedVLLM  # noqa: E402
from rlvr.backends.sample.vllm_setup import GIB, engine_kwargs, request_kwargs  # noqa: E402
from rlvr.backends.sync.colocate import ColocateLane, SleepWhileTraining, merged_weights, policy_weights  # noqa: E402
from rlvr.errors import BackendError, ConfigError  # noqa: E402
from rlvr.types import SamplingParams, StopReason  # noqa: E402

pytestmark = pytest.mark.train


# ---- request and engine arguments -----------------------------------------------------------------
def test_a_request_carries_its_seed_the_eos_ids_and_asks_for_the_sampled_log_probs_only():
    params = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, stop_token_ids=(9,), allowed_token_ids=(1, 2),
                            bad_words_ids=((3, 4),))
    kwargs = request_kwargs(params, (1 << 63) + 5, stop_ids=[2, 9])
    assert kwargs["seed"] == 5  # vLLM keeps seeds in an int64
    assert kwargs["stop_token_ids"] == [2, 9] and kwargs["allowed_token_ids"] == [1, 2]
    assert kwargs["_bad_words_token_ids"] == [[3, 4]]
    assert (kwargs["logprobs"], kwargs["flat_logprobs"], kwargs["detokenize"]) == (0, True, False)
    assert (kwargs["max_tokens"], kwargs["temperature"], kwargs["top_p"]) == (5, 0.7, 0.9)
    assert "stop" not in kwargs and "top_k" not in kwargs
    assert request_kwargs(SamplingParams(stop=("\n",)), 1, [])["detokenize"] is True  # stop strings need text


def test_the_sampling_knobs_go_to_vllm_under_its_names_when_set():
    kwargs = request_kwargs(SamplingParams(top_k=5, min_p=0.1, repetition_penalty=1.3), 0, [])
    assert (kwargs["top_k"], kwargs["min_p"], kwargs["repetition_penalty"]) == (5, 0.1, 1.3)
    off = request_kwargs(SamplingParams(top_k=-1), 0, [])
    assert not {"top_k", "min_p", "repetition_penalty"} & off.keys()


def test_a_sampling_field_the_engine_does_not_map_is_refused_unless_left_at_its_default():
    @dataclasses.dataclass(frozen=True)
    class Wider(SamplingParams):
        presence_penalty: float = 0.0

    assert request_kwargs(Wider(), 0, [])["max_tokens"] == 16
    with pytest.raises(BackendError, match="does not map SamplingParams.presence_penalty"):
        request_kwargs(Wider(presence_penalty=0.5), 0, [])


def test_engine_arguments_bound_the_kv_cache_and_sleep_only_on_cuda():
    cpu = engine_kwargs("m", dtype="float32", seed=3, device="cpu")
    assert cpu["kv_cache_memory_bytes"] == GIB and "enable_sleep_mode" not in cpu
    assert (cpu["logprobs_mode"], cpu["distributed_executor_backend"], cpu["seed"]) == ("processed_logprobs", "uni", 3)
    gpu = engine_kwargs("m", dtype="bfloat16", seed=0, device="cuda", sleep=True)
    assert gpu["gpu_memory_utilization"] == 0.3 and gpu["enable_sleep_mode"] is True
    assert "kv_cache_memory_bytes" not in gpu
    sized = engine_kwargs("m", dtype="bfloat16", seed=0, device="cuda", kv_cache_gib=4)
    assert sized["kv_cache_memory_bytes"] == 4 * GIB and "gpu_memory_utilization" not in sized
    assert "enable_sleep_mode" not in engine_kwargs("m", dtype="float32", seed=0, device="cpu", sleep=True)


# ---- the engine over a stand-in LLM ---------------------------------------------------------------
class Flat(SimpleNamespace):
    def __len__(self):
        return len(self.start_indices)


def flat(entries):
    """vLLM's flat log-probs: one ``(token, logprob)`` per position, or None for an empty one."""
    starts, ends, ids, values = [], [], [], []
    for entry in entries:
        starts.append(len(ids))
        if entry is not None:
            ids.append(entry[0])
            values.append(entry[1])
        ends.append(len(ids))
    return Flat(start_indices=starts, end_indices=ends, token_ids=ids, logprobs=values)


class StandInLLM:
    """Answers each request with tokens ``seed % 7, seed % 7 + 1`` (log-prob -0.5 each, the second
    -inf when the seed is 6), records every call, and 'loads' weights by summing them."""

    def __init__(self):
        self.calls, self.loaded, self.events, self.fail_next = [], [], [], None

    def generate(self, prompts, params, use_tqdm=False):
        self.events.append("generate")
        if self.fail_next is not None:
            raise self.fail_next
        self.calls.append(list(zip(prompts, params, strict=True)))
        outs = []
        for prompt, kw in zip(prompts, params, strict=True):
            if kw.get("prompt_logprobs") == 0:
                entries = [None] + [(t, -0.25 * t) for t in prompt[1:]]
                outs.append(SimpleNamespace(prompt_logprobs=flat(entries), outputs=[]))
                continue
            first = kw["seed"] % 7
            ids = [first, first + 1]
            lps = [(ids[0], -0.5), (ids[1], float("-inf") if first == 6 else -0.5)]
            reason = "stop" if first + 1 in kw["stop_token_ids"] else "length"
            choice = SimpleNamespace(token_ids=ids, logprobs=flat(lps), finish_reason=reason)
            outs.append(SimpleNamespace(outputs=[choice], prompt_logprobs=None))
        return outs

    def collective_rpc(self, method, args=()):
        weights = args[0]
        worker = SimpleNamespace(model_runner=SimpleNamespace(
            reload_weights=lambda weights_iterator, is_checkpoint_format: self.loaded.append(
                {name: float(t.sum()) for name, t in weights_iterator})))
        self.events.append("load")
        return [method(worker, weights)]

    def reset_prefix_cache(self):
        self.events.append("reset")

    def sleep(self, level):
        self.events.append(f"sleep{level}")

    def wake_up(self):
        self.events.append("wake")


def stand_in_engine(**kwargs):
    llm = StandInLLM()
    engine = ColocatedVLLM(llm, eos_ids={4}, **kwargs)
    engine.build_request = lambda prompt, kw: (prompt, kw)
    return engine, llm


def test_requests_of_one_loop_turn_go_in_one_generate_call_each_with_its_own_seed():
    engine, llm = stand_in_engine(version=3)

    async def main():
        params = SamplingParams(max_tokens=2, temperature=1.0)
        return await asyncio.gather(*[engine.generate([1, 2], params, seed=s) for s in (10, 11, 13)])

    try:
        outs = asyncio.run(main())
    finally:
        engine.close()
    assert len(llm.calls) == 1 and [kw["seed"] for _, kw in llm.calls[0]] == [10, 11, 13]
    assert [o.ids for o in outs] == [(3, 4), (4, 5), (6, 7)]
    assert [o.stop_reason for o in outs] == [StopReason.STOP, StopReason.LENGTH, StopReason.LENGTH]  # 4 is eos
    assert outs[2].logprobs == (-0.5, LOGPROB_FLOOR) and {o.version for o in outs} == {3}


def test_a_publish_lands_between_two_calls_resets_the_prefix_cache_and_sets_the_version():
    engine, llm = stand_in_engine()
    try:
        served = engine.publish(lambda: iter([("w", torch.ones(2, 2)), ("b", torch.ones(3))]), 7)
        out = engine.generate_now([1], SamplingParams(max_tokens=2), seed=1)
    finally:
        engine.close()
    assert served == 7 and out.version == 7 and llm.loaded == [{"w": 4.0, "b": 3.0}]
    assert llm.events == ["load", "reset", "generate"]


def test_scores_are_the_prompt_log_probs_of_the_completion_positions():
    engine, _ = stand_in_engine()

    async def main():
        return await engine.score([5, 6], [8, 12])

    try:
        assert asyncio.run(main()) == [-2.0, -3.0]
    finally:
        engine.close()


def test_a_failed_generate_reaches_every_waiter_and_a_failed_load_refuses_later_calls():
    engine, llm = stand_in_engine()
    llm.fail_next = RuntimeError("device lost")

    async def two():
        params = SamplingParams(max_tokens=2)
        return await asyncio.gather(*[engine.generate([1], params, seed=s) for s in (1, 2)], return_exceptions=True)

    try:
        assert [str(e) for e in asyncio.run(two())] == ["device lost", "device lost"]
        llm.fail_next = None

        def broken():
            raise ValueError("bad tensor")
            yield

        with pytest.raises(ValueError, match="bad tensor"):
            engine.publish(broken, 1)
        with pytest.raises(BackendError, match="weights could not be loaded"):
            engine.generate_now([1], SamplingParams(max_tokens=2), seed=1)
        assert engine.publish(lambda: iter([]), 2) == 2  # a later good load serves again
        assert engine.generate_now([1], SamplingParams(max_tokens=2), seed=1).version == 2
    finally:
        engine.close()


def test_a_prompt_past_the_context_is_refused_naming_both_lengths():
    engine, _ = stand_in_engine(max_model_len=10)
    try:
        with pytest.raises(BackendError, match="prompt of 8 tokens plus max_tokens=4 exceeds .* max_model_len of 10"):
            engine.generate_now(list(range(8)), SamplingParams(max_tokens=4), seed=0)
    finally:
        engine.close()


def test_the_engine_sleeps_through_a_train_step_and_wakes_for_the_next_load():
    engine, llm = stand_in_engine(sleep=True)
    trainer = SleepWhileTraining(lambda batch: {"train/loss": 1.0}, engine)
    try:
        metrics = trainer(object())
        assert engine.asleep and llm.events == ["sleep1"] and metrics["train/loss"] == 1.0
        assert "vllm/sleep_s" in metrics
        engine.publish(lambda: iter([]), 1)
        assert not engine.asleep and llm.events == ["sleep1", "wake", "load", "reset"]
        assert "vllm/wake_s" in trainer(object())  # the wake before this step's samples
        engine.generate_now([1], SamplingParams(max_tokens=2), seed=0)  # a request while asleep wakes it, counted
        assert engine.woken_to_sample == 1
    finally:
        engine.close()


def test_without_sleep_mode_sleep_is_a_no_op():
    engine, llm = stand_in_engine(sleep=False)
    try:
        assert engine.sleep() == {} and llm.events == []
    finally:
        engine.close()


# ---- weights and the lane -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden=32, layers=1, heads=1)


def lora_policy(base):
    from rlvr.backends.model.policy import LoraSpec, Policy

    policy = Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0), need_reference=False)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # B starts at zero: give the adapter a delta to merge
    return policy


def test_merged_lora_weights_are_the_merged_model_in_the_base_names_and_leave_the_adapter_alone(tiny_base):
    policy = lora_policy(tiny_base)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    merged = dict(merged_weights(policy.model))
    reference = copy.deepcopy(policy.model).merge_and_unload()
    expected = dict(reference.named_parameters(remove_duplicate=False))
    assert set(merged) == set(expected)  # base names, tied weights under every name, no adapter tensors
    assert "lm_head.weight" in merged and not any("lora" in n for n in merged)
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor.detach(), rtol=0, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (merged[q] - before[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"]).abs().max() > 1e-3
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters())


def test_a_full_policy_pushes_every_parameter_under_every_name(tiny_base):
    from rlvr.backends.model.policy import Policy

    policy = Policy(str(tiny_base), lora=None, need_reference=False)
    names = [n for n, _ in policy_weights(policy)]
    assert names == [n for n, _ in policy.model.named_parameters(remove_duplicate=False)]
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names


class ProbeEngine:
    """Serves what the policy itself says (``shift`` 0) or something else; reports ``served``."""

    def __init__(self, policy, shift=0.0, served=None):
        self.policy, self.shift, self.served, self.pushed = policy, shift, served, []

    def publish(self, weights, version):
        self.pushed.append(dict(weights()))
        return version if self.served is None else self.served

    def generate_now(self, prompt, params, *, seed):
        from rlvr.backends.model.io import token_logprobs
        from rlvr.types import Completion

        ids = [7, 8, 9, 10][:params.max_tokens]
        full = torch.tensor([list(prompt) + ids])
        with torch.no_grad():
            own = token_logprobs(self.policy.model, full, torch.ones_like(full))[0, len(prompt) - 1:]
        return Completion(tuple(ids), tuple(float(x) + self.shift for x in own), StopReason.LENGTH, 0)


def test_the_lane_pushes_the_weights_and_checks_version_and_probe(tiny_base):
    policy = lora_policy(tiny_base)
    engine = ProbeEngine(policy)
    lane = ColocateLane(engine, policy)
    assert lane(1) == 1 and lane.probe_gaps[-1] < 1e-5
    assert set(engine.pushed[0]) == set(dict(merged_weights(policy.model)))
    with pytest.raises(BackendError, match="serves policy version 0 after publishing version 2"):
        ColocateLane(ProbeEngine(policy, served=0), policy)(2)
    with pytest.raises(BackendError, match=r"differ from the policy's by 0\.3.*reload did not take"):
        ColocateLane(ProbeEngine(policy, shift=0.3), policy)(2)
    assert ColocateLane(ProbeEngine(policy, shift=0.3), policy, verify=False)(2) == 2


# ---- the config ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("override", "message"), [
    ({"url": "http://127.0.0.1:8000/v1"}, "sampler.url does not apply"),
    ({"replicas": 2}, "sampler.replicas does not apply"),
    ({"lane": "lora_hot_load"}, "sampler.lane does not apply"),
    ({"vllm_python": "/usr/bin/python3"}, "run rlvr from vLLM's environment"),
])
def test_server_settings_are_refused_for_a_colocated_engine(override, message):
    from rlvr.config.run import run_config_from_dict

    with pytest.raises(ConfigError, match=message):
        run_config_from_dict({"sampler": {"backend": "vllm_colocate", **override}})


def test_sharded_training_and_a_second_gpu_are_refused_for_a_colocated_engine():
    from rlvr.config.run import run_config_from_dict

    with pytest.raises(ConfigError, match="train.shard = 'fsdp'"):
        run_config_from_dict({"sampler": {"backend": "vllm_colocate"}, "train": {"shard": "fsdp"}})
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES"):
        run_config_from_dict({"sampler": {"backend": "vllm_colocate"}, "model": {"device": "cuda:1"}})
    assert run_config_from_dict({"sampler": {"backend": "vllm_colocate"}, "model": {"device": "cuda"}})


def test_a_colocated_run_without_vllm_is_refused_before_the_run_folder_is_touched(tmp_path, monkeypatch):
    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.scale import colocate
    from rlvr.wiring.seams import make_loop

    monkeypatch.setattr(colocate.importlib.util, "find_spec", lambda name: None)
    cfg = run_config_from_dict({"sampler": {"backend": "vllm_colocate"}, "task": {"name": "addition", "n": 120},
                                "loop": {"corpus_min": 20}})
    with pytest.raises(ConfigError, match=r"cannot import vllm.*make vllm.*\.venv-vllm/bin/rlvr"):
        make_loop(cfg, tmp_path / "run", log=lambda _: None)
    assert not (tmp_path / "run").exists()


def test_several_trainer_ranks_are_refused_for_a_colocated_engine(monkeypatch):
    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.scale import colocate

    monkeypatch.setattr(colocate.importlib.util, "find_spec", lambda name: object())
    cfg = run_config_from_dict({"sampler": {"backend": "vllm_colocate"}})
    with pytest.raises(ConfigError, match="drop --nproc"):
        colocate.check_colocated(cfg, SimpleNamespace(world_size=2))


def test_the_colocated_example_reads_as_the_lora_demo_on_vllm_inside_the_process():
    from pathlib import Path

    from rlvr.config.run import load_run_config

    cfg = load_run_config(Path(__file__).resolve().parents[2] / "examples" / "addition_vllm_colocate.toml")
    assert cfg.sampler.backend == "vllm_colocate" and cfg.loop.lora_rank == 16 and cfg.model.device == "cpu"


@pytest.mark.parametrize("flags", [["--logprobs-mode", "raw_logprobs"], ["--tensor_parallel_size=2"], ["--model=x"]])
def test_engine_flags_rlvr_sets_itself_are_refused_whatever_their_value(flags):
    from rlvr.backends.sample.vllm_setup import user_engine_args

    with pytest.raises(ConfigError, match=r"sampler.vllm_args sets --[a-z-]+, which .* sets itself"):
        user_engine_args(flags)


def test_a_closed_engine_refuses_work_instead_of_waiting_forever():
    engine, _ = stand_in_engine()
    engine.close()
    with pytest.raises(BackendError, match="engine was closed"):
        engine.generate_now([1], SamplingParams(max_tokens=2), seed=0)
    with pytest.raises(BackendError, match="engine was closed"):
        engine.publish(lambda: iter([]), 1)
