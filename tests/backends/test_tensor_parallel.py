"""Tensor parallelism beside FSDP2 on real processes (gloo on loopback): a (dp, tp) mesh trains what one
process trains, full fine-tune and LoRA, within the float32 tolerance derived for this batch and model
(tests/support/dp_rig.py's ``parity_tolerance``, as the data-parallel tests use), each rank holding its slice
of every split weight, and rank 0's gathered copy is the trained policy. Plans the trainer cannot apply
are refused, naming the key."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from support.dp_rig import make_batch, one_rank, parity_tolerance, spawn_ranks, weights  # noqa: E402

SHAPE = {"ppo_n_minibatches": 2, "micro_batch": 2, "max_grad_norm": 0.05}
STEPS = 3


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=4, seed=0)


def diffs(a, b) -> dict[str, float]:
    return {k: float((a[k] - b[k]).abs().max()) for k in a}


@pytest.mark.slow
@pytest.mark.train
def test_a_2x2_mesh_trains_what_one_process_trains_full_and_lora(base, tmp_path):
    batch = make_batch(shared_prompts=False)
    world = 4  # dp = 2 data shares x tp = 2 slices of every split layer
    both = spawn_ranks(world, base, (False, True), [("train", batch)] * STEPS, tmp_path, shard="fsdp",
                       tensor_parallel=2, **SHAPE)  # one start-up of 4 processes for both
    for lora, ranks in both.items():
        check_against_one_process(base, lora, batch, ranks)


def check_against_one_process(base, lora: bool, batch, ranks) -> None:
    reference, metrics = one_rank(base, lora, [batch] * STEPS, share_prompts=False, **SHAPE)
    want = weights(reference)
    # The mesh reorders four reductions (micro-batches within a share, FSDP's reduce-scatter over dp,
    # the all-reduce of each row-wise layer's partial sums over tp, the gradient norm's per-mesh parts):
    # equal in exact arithmetic, apart within float32's bound. (8x a one-process reorder's distance was
    # too tight: on an Intel Xeon with AMX the LoRA mesh ended 1.1e-5 apart, 8x the reorder 4.9e-6.)
    tolerance = parity_tolerance(base, [batch], STEPS * SHAPE["ppo_n_minibatches"])
    moved = max(diffs(want, weights(one_rank(base, lora, [], **SHAPE)[0])).values())
    got = diffs(ranks[0]["weights"], want)
    print(f"2x2 mesh, lora {lora}: max weight diff {max(got.values()):.3g}, tolerance {tolerance:.3g}, "
          f"moved {moved:.3g}")
    assert moved > 10 * tolerance  # the steps moved the weights: a real comparison
    assert max(got.values()) < tolerance, sorted(got.items(), key=lambda kv: -kv[1])[:3]
    assert max(diffs(ranks[0]["gathered"], want).values()) < tolerance
    assert all(r["version"] == STEPS for r in ranks)
    full = {n: p.numel() for n, p in reference.policy.model.named_parameters()}
    split = [n for n in ranks[0]["shards"] if "q_proj" in n and ("lora_B" in n or not lora)]
    assert split and all(ranks[0]["shards"][n] <= full[n] // 4 for n in split)  # a tp slice of a dp shard
    for g, w in zip(ranks[0]["metrics"], metrics, strict=True):
        assert g["train/grad_norm"] == pytest.approx(w["train/grad_norm"], rel=1e-4, abs=1e-6)
        assert g["loss/total"] == pytest.approx(w["loss/total"], rel=1e-4, abs=1e-6)


def test_the_plan_is_the_models_own_and_what_cannot_be_split_is_refused(base):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rlvr.backends.model.policy import LoraSpec, Policy
    from rlvr.backends.train.tensor_parallel import check_divisible, layer_plan, layer_styles
    from rlvr.errors import BackendError

    full = Policy(str(base), lora=None, need_reference=False, seed=0).model
    styles = layer_styles(full)
    assert styles == {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
                      "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                      "mlp.down_proj": "rowwise"}
    assert sorted(layer_plan(full.model.layers[0], styles)) == sorted(styles)
    full.config.base_model_tp_plan = {**full.config.base_model_tp_plan, "embed_tokens": "embedding_rowwise",
                                      "norm": "replicated_with_grad_allreduce"}  # 5.17 lists embed_tokens
    assert layer_styles(full) == styles  # outside the decoder layers nothing is split, whatever the plan says
    lora = Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0), need_reference=False, seed=0).model
    layer = lora.base_model.model.model.layers[0]
    plan = layer_plan(layer, layer_styles(lora))
    assert {k for k in plan if k.startswith("self_attn.q_proj")} == {"self_attn.q_proj.base_layer",
                                                                     "self_attn.q_proj.lora_B.default"}
    assert {k for k in plan if k.startswith("self_attn.o_proj")} == {"self_attn.o_proj.base_layer",
                                                                     "self_attn.o_proj.lora_A.default"}
    check_divisible(full, 2)  # 4 heads, 4 key-value heads, MLP 128
    with pytest.raises(BackendError, match=r"train.tensor_parallel = 3: the model's .*num_attention_heads"):
        check_divisible(full, 3)
    qwen3 = AutoModelForCausalLM.from_config(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                         num_hidden_layers=1, num_attention_heads=4,
                                                         num_key_value_heads=2, head_dim=8))
    with pytest.raises(BackendError, match=r"splits 'layers.\*.self_attn.q_norm' as 'replicated_with_grad_allreduce'"):
        layer_styles(qwen3)
