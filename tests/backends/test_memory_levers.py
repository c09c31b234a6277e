"""The memory levers change what a train step holds, never its numbers: the chunked output head,
gradient checkpointing (with every layout) and ``micro_batch = "auto"``."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.backends.model import head as head_module  # noqa: E402
from rlvr.backends.model import precision  # noqa: E402
from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.train import micro_batch as sizing  # noqa: E402
from rlvr.backends.train.checkpointing import enable_gradient_checkpointing, keeps_cache_when_checkpointed  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer, completion_logprobs, pack  # noqa: E402
from rlvr.testing import batch_of  # noqa: E402
from rlvr.types import Rollout  # noqa: E402

pytestmark = pytest.mark.train
LAYOUTS = {"padded": {}, "shared": {"share_prompts": True}, "packed": {"packed": True}}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


def make_policy(base, lora: bool) -> Policy:
    policy = Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0) if lora else None, need_reference=False)
    with torch.no_grad():  # a trained-looking adapter, so the LoRA path changes the numbers
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    policy.model.train()
    return policy


def rollouts(policy, k=3):
    """Three prompts of different lengths, ``k`` completions of 2-5 tokens each."""
    draw = torch.Generator().manual_seed(0)
    out = []
    for i, text in enumerate(["12+7=", "3+4=", "100+250="]):
        prompt = tuple(policy.tokenizer(text)["input_ids"])
        for j in range(k):
            completion = tuple(torch.randint(5, 20, (2 + (i + j) % 4,), generator=draw).tolist())
            out.append(Rollout(task_id=str(i), prompt_ids=prompt, completion_ids=completion,
                               logprobs=(-1.0,) * len(completion), text="", messages=()))
    return batch_of(out, [1.0, -0.5, 0.3] * k)


def logp_and_grads(policy, batch, entropy: bool, **layout):
    policy.model.zero_grad(set_to_none=True)
    out = completion_logprobs(policy.model, batch, 0.7, with_entropy=entropy, **layout)
    logp, ent = out if entropy else (out, None)
    loss = (logp * batch["advantages"]).sum() + (0.1 * (ent * batch["mask"]).sum() if entropy else 0.0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    policy.model.zero_grad(set_to_none=True)
    return logp.detach(), None if ent is None else ent.detach(), grads


def assert_same(a, b, tol=1e-5):
    logp, ent, grads = a
    logp_b, ent_b, grads_b = b
    assert torch.allclose(logp, logp_b, atol=tol)
    assert ent is None or torch.allclose(ent, ent_b, atol=tol)
    assert grads.keys() == grads_b.keys() and grads
    for name, g in grads.items():
        assert torch.allclose(g, grads_b[name], atol=tol, rtol=1e-4), name


# ---- the chunked head ---------------------------------------------------------------------------
@pytest.mark.parametrize("positions_per_chunk", [7, 37, 100], ids=lambda n: f"chunk{n}")  # 7 does not divide 37
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("entropy", [False, True])
def test_chunked_linear_head_is_the_log_softmax_of_its_logits(monkeypatch, positions_per_chunk, bias, temperature,
                                                              entropy):
    monkeypatch.setattr(head_module, "HEAD_CHUNK_ELEMENTS", positions_per_chunk * 50)
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 50, bias=bias)
    with torch.no_grad():
        lin.weight.mul_(5)  # peaked distributions
    hidden = torch.randn(37, 16, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    g_logp, g_ent = torch.randn(37), torch.randn(37)

    def run(fn):
        lin.zero_grad()
        hidden.grad = None
        logp, ent = fn()
        ((logp * g_logp).sum() + ((ent * g_ent).sum() if entropy else 0)).backward()
        return [logp.detach(), ent.detach(), hidden.grad, lin.weight.grad] + ([lin.bias.grad] if bias else [])

    def reference():
        logp_all = torch.log_softmax(lin(hidden) / (temperature or 1.0), dim=-1)
        return logp_all.gather(1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)

    def chunked():
        out = head_module.head_logprobs(hidden, lin, targets, temperature, with_entropy=entropy)
        return out if entropy else (out, torch.zeros(37))

    want, got = run(reference), run(chunked)
    if not entropy:  # only the log-probs and the gradients are compared
        del want[1], got[1]
    for w, g in zip(want, got, strict=True):
        assert torch.allclose(w, g, atol=1e-5), (w - g).abs().max()
    with torch.no_grad():  # no graph: the same values
        plain = head_module.head_logprobs(hidden, lin, targets, temperature)
    assert torch.allclose(plain, want[0], atol=1e-5)


@pytest.mark.parametrize("positions_per_chunk", [1, 4, 5, 20, 64], ids=lambda n: f"chunk{n}")
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full-tied"])
def test_masked_log_probs_equal_the_plain_log_softmax_gather(base, monkeypatch, positions_per_chunk, lora):
    """token_logprobs over a left- and a right-padded row against ``log_softmax(logits / T).gather``
    with the padded targets zeroed, values and every gradient; 13 scored positions cut in chunks of
    1, 4 and 5 (4 and 5 leave a shorter last chunk), 20 and 64 (one chunk)."""
    from rlvr.backends.model.io import token_logprobs

    policy = make_policy(base, lora)
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(head_module, "HEAD_CHUNK_ELEMENTS", positions_per_chunk * vocab)
    ids = torch.tensor([[0, 0, 7, 8, 9, 10, 11, 12, 13], [7, 9, 11, 13, 15, 17, 19, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 0]])
    weights = torch.randn(2, 8, generator=torch.Generator().manual_seed(3))
    keep = mask[:, 1:].bool()
    assert int(keep.sum()) == 13

    def grads_of(logp):
        policy.model.zero_grad(set_to_none=True)
        (logp * weights).sum().backward()
        return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}

    chunked = token_logprobs(policy.model, ids, mask, temperature=0.7)
    chunked_grads = grads_of(chunked)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = policy.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, :-1].float()
    plain = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    plain = torch.where(keep, plain, 0.0)
    plain_grads = grads_of(plain)
    assert torch.allclose(chunked, plain, atol=1e-5) and (chunked[~keep] == 0).all()
    assert plain_grads.keys() == chunked_grads.keys() and plain_grads
    for name, g in plain_grads.items():
        assert torch.allclose(chunked_grads[name], g, atol=1e-5, rtol=1e-4), name


def test_a_head_that_is_not_a_bare_linear_is_chunked_by_checkpointing(monkeypatch):
    monkeypatch.setattr(head_module, "HEAD_CHUNK_ELEMENTS", 5 * 30)
    torch.manual_seed(1)
    lin = torch.nn.Linear(8, 30)
    lin.register_forward_hook(lambda module, args, out: out * 2.0)  # a hook changes the logits
    assert not head_module.plain_linear(lin)
    hidden = torch.randn(23, 8, requires_grad=True)
    targets = torch.randint(0, 30, (23,))
    logp, ent = head_module.head_logprobs(hidden, lin, targets, 0.5, with_entropy=True)
    (logp.sum() + ent.sum()).backward()
    got = (logp.detach(), ent.detach(), hidden.grad.clone(), lin.weight.grad.clone())
    hidden.grad, lin.weight.grad = None, None
    logp_all = torch.log_softmax(lin(hidden) / 0.5, dim=-1)
    logp_ref, ent_ref = logp_all.gather(1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)
    (logp_ref.sum() + ent_ref.sum()).backward()
    for w, g in zip((logp_ref.detach(), ent_ref.detach(), hidden.grad, lin.weight.grad), got, strict=True):
        assert torch.allclose(w, g, atol=1e-5)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full-tied"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("entropy", [False, True])
def test_chunked_head_gives_the_whole_logits_numbers(base, monkeypatch, lora, layout, entropy):
    """Against the model run whole (its [tokens, vocab] logits made): log-probs, entropies and every
    gradient, the tied embedding matrix's included under a full fine-tune."""
    monkeypatch.setattr(head_module, "HEAD_CHUNK_ELEMENTS", 3 * 64)  # several chunks even here
    policy = make_policy(base, lora)
    batch = pack(rollouts(policy).rollouts, policy.tokenizer.pad_token_id, "cpu")
    chunked = logp_and_grads(policy, batch, entropy, **LAYOUTS[layout])
    with monkeypatch.context() as m:
        m.setattr(precision, "split_head", lambda model: None)
        whole = logp_and_grads(policy, batch, entropy, **LAYOUTS[layout])
    assert_same(chunked, whole)
    if not lora:  # the head's weight is the embedding matrix: one gradient, from both uses
        assert policy.model.get_output_embeddings().weight is policy.model.get_input_embeddings().weight
        assert any("embed_tokens" in name for name in chunked[2])


def test_the_graph_of_the_chunked_log_probs_holds_nothing_vocabulary_wide(base):
    policy = make_policy(base, lora=False)
    batch = pack(rollouts(policy).rollouts, policy.tokenizer.pad_token_id, "cpu")
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    shapes = []

    def keep(tensor):
        if not isinstance(tensor, torch.nn.Parameter):
            shapes.append(tuple(tensor.shape))
        return tensor

    for layout in LAYOUTS.values():
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            completion_logprobs(policy.model, batch, 0.7, with_entropy=True, **layout)
    assert shapes and not [s for s in shapes if vocab in s]


# ---- gradient checkpointing -------------------------------------------------------------------
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_checkpointing_gives_the_same_numbers_in_every_layout(base, monkeypatch, lora):
    from rlvr.backends.train import shared_prefix

    policy = make_policy(base, lora)
    batch = pack(rollouts(policy).rollouts, policy.tokenizer.pad_token_id, "cpu")
    plain = {name: logp_and_grads(policy, batch, True, **layout) for name, layout in LAYOUTS.items()}
    plain_saved = sizing.saved_bytes(policy.model, lambda: completion_logprobs(policy.model, batch, 0.7))
    enable_gradient_checkpointing(policy.model)
    assert keeps_cache_when_checkpointed(policy.model)
    calls = []
    real = shared_prefix.shared_prompt_logprobs
    monkeypatch.setattr("rlvr.backends.train.trainer.shared_prompt_logprobs",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    for name, layout in LAYOUTS.items():
        assert_same(logp_and_grads(policy, batch, True, **layout), plain[name], tol=1e-6)
    assert calls  # the shared layout ran checkpointed (it did not fall back to padded rows)
    saved = sizing.saved_bytes(policy.model, lambda: completion_logprobs(policy.model, batch, 0.7))
    assert saved < plain_saved / 2  # each layer keeps its input only


def test_shared_prompts_fall_back_to_padded_rows_where_a_checkpointed_layer_would_drop_the_cache(base):
    from rlvr.backends.train.shared_prefix import shared_prompt_logprobs

    policy = make_policy(base, lora=True)
    batch = pack(rollouts(policy).rollouts, policy.tokenizer.pad_token_id, "cpu")
    enable_gradient_checkpointing(policy.model)
    layer = policy.model.get_base_model().model.layers[0]
    layer._can_checkpoint_with_cache = False  # as a transformers without the mark would
    assert not keeps_cache_when_checkpointed(policy.model)
    assert shared_prompt_logprobs(policy.model, batch, 0.7) is None


# ---- micro_batch = "auto" ---------------------------------------------------------------------
def test_saved_bytes_counts_what_the_graph_keeps_and_no_parameter():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    assert sizing.saved_bytes(lin, lambda: lin(x)) == 5 * 4 * 4  # the input, for the weight's gradient
    assert sizing.saved_bytes(lin, lambda: torch.tanh(lin(x))) == 5 * 4 * 4 + 5 * 3 * 4  # and tanh's output


def test_live_bytes_counts_what_the_forward_leaves_alive_in_its_graph_or_beside_it():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)  # made before the forward: not counted (nor is the weight, a parameter)
    assert sizing.live_bytes(lin, lambda: lin(x)) == 5 * 3 * 4  # the result, held
    assert sizing.live_bytes(lin, lambda: torch.tanh(lin(x) * 2)) == 5 * 3 * 4  # tanh keeps its output only
    kept = []  # what a forward keeps outside the graph (a shared prompt's copied KV cache) counts too
    assert sizing.live_bytes(lin, lambda: kept.append(torch.ones(100)) or lin(x)) == 400 + 5 * 3 * 4
    assert sizing.live_bytes(lin, lambda: (torch.ones(100), lin(x))[1]) == 5 * 3 * 4  # freed before the end


def test_an_estimate_adds_the_larger_of_the_heads_buffers_and_the_backwards_transients():
    estimate = sizing.MemoryEstimate(per_token=10, transient=3, head_per_token=5, head_cap=400, fixed=7,
                                     budget=0, width=10, rows=4)
    assert estimate.total == 40 * 10 + 40 * 5 + 7  # 40 tokens: the head's 200 bytes beat 120 of transients
    assert estimate.bytes_for(20) == 200 * 10 + 200 * 3 + 7  # the head capped at a chunk; the transients win
    assert estimate.metrics()["train/memory_estimate_gib"] == 607 / 2**30


def test_the_sizer_takes_the_most_rows_its_budget_holds(monkeypatch, base):
    policy = make_policy(base, lora=True)
    batch = rollouts(policy, k=4).rollouts  # 12 rows
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in batch)
    optimizer = torch.optim.AdamW(policy.trainable_parameters())
    sizer = sizing.MicroBatchSizer(budget_frac=0.5, device="cpu")
    sizer.per_token, sizer.transient, sizer.probed_width = 1000.0, 50.0, width  # measured once; set here
    trainable = sum(p.numel() * 4 for p in policy.trainable_parameters())
    assert sizing.fixed_bytes(policy.model, optimizer) == 3 * trainable  # gradients and AdamW's moments to come
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    assert sizing.head_bytes(policy.model) == (4 * vocab * 4.0, 4 * sizing.HEAD_CHUNK_ELEMENTS * 4.0)
    five = 5 * width * (1000 + max(50, 16 * vocab)) + 3 * trainable  # bytes of five rows
    for free, rows in ((2 * five, 5), (2 * five - 2, 4), (0.0, 1), (1e15, 12)):
        monkeypatch.setattr(sizing, "free_bytes", lambda device, floor=0.0, free=free: free)
        assert sizer.rows(batch, policy.model, optimizer, probe=None) == rows
    assert sizer.last.rows == 12 and sizer.last.width == width


def test_the_probe_takes_the_longest_row_with_a_row_of_its_prompt_and_runs_again_for_longer_rows(base):
    policy = make_policy(base, lora=True)
    batch = rollouts(policy, k=4).rollouts  # three prompts of different lengths, four rows each
    chosen = sizing.probe_rows(batch)
    assert chosen[0] is max(batch, key=lambda r: len(r.prompt_ids) + len(r.completion_ids))
    assert len(chosen) == 2 and chosen[1].prompt_ids == chosen[0].prompt_ids and chosen[1] is not chosen[0]
    probed = []
    pad = policy.tokenizer.pad_token_id

    def probe(rows):
        probed.append(len(rows))
        return completion_logprobs(policy.model, pack(rows, pad, "cpu"), 0.7, share_prompts=True)

    optimizer = torch.optim.AdamW(policy.trainable_parameters())
    sizer = sizing.MicroBatchSizer(budget_frac=0.5, device="cpu")
    sizer.rows(batch, policy.model, optimizer, probe)
    once = len(probed)
    sizer.rows(batch, policy.model, optimizer, probe)
    assert once and probed == [2] * once and sizer.per_token > 0 and sizer.transient > 0  # measured once
    assert all(p.grad is None for p in policy.model.parameters())  # a measured backward leaves no gradient
    sizer.probed_width = int(sizer.probed_width / sizing.REPROBE_GROWTH) - 1  # as if measured on shorter rows
    sizer.rows(batch, policy.model, optimizer, probe)
    assert probed == [2] * (2 * once)


def test_what_the_rss_rose_by_beyond_the_count_is_charged_per_token(base, monkeypatch):
    policy = make_policy(base, lora=True)
    batch = rollouts(policy).rollouts[:2]
    tokens = 2 * max(len(r.prompt_ids) + len(r.completion_ids) for r in batch)
    pad = policy.tokenizer.pad_token_id

    def probe(rows):
        return completion_logprobs(policy.model, pack(rows, pad, "cpu"), 0.7, share_prompts=True)

    monkeypatch.setattr(sizing, "rss_measurable", lambda model: False)
    counted, transient, settled = sizing.measure_per_token(policy.model, batch, probe)
    assert settled == 0  # nothing measured
    head_per_token, head_cap = sizing.head_bytes(policy.model)
    total = tokens * counted + max(min(head_cap, tokens * head_per_token), tokens * transient)
    monkeypatch.setattr(sizing, "rss_measurable", lambda model: True)
    for grown, per_token in ((total + 1000 * tokens, counted + 1000), (total / 2, counted)):  # never below the count
        monkeypatch.setattr(sizing, "rss_growth", lambda model, forward, grown=grown: grown)
        measured = sizing.measure_per_token(policy.model, batch, probe)
        assert measured[:2] == (pytest.approx(per_token), transient) and measured[2] >= 0


def test_free_memory_on_cpu_leaves_the_watchdogs_floor(monkeypatch):
    monkeypatch.setattr(sizing, "meminfo_mb", lambda: (6000.0, 10000.0))
    assert sizing.free_bytes("cpu", 0.05) == (6000.0 - 500.0) * 2**20
    monkeypatch.setattr(sizing, "meminfo_mb", lambda: (None, None))
    with pytest.raises(Exception, match="train.micro_batch"):
        sizing.free_bytes("cpu")


def test_the_probe_measures_more_per_token_without_checkpointing(base, monkeypatch):
    monkeypatch.setattr(sizing, "rss_measurable", lambda model: False)  # the count alone
    policy = make_policy(base, lora=True)
    batch = rollouts(policy).rollouts
    pad = policy.tokenizer.pad_token_id

    def probe(rows):
        return completion_logprobs(policy.model, pack(rows, pad, "cpu"), 0.7, share_prompts=True)

    plain, plain_transient, _ = sizing.measure_per_token(policy.model, batch[:2], probe)
    enable_gradient_checkpointing(policy.model)
    checkpointed, transient, _ = sizing.measure_per_token(policy.model, batch[:2], probe)
    assert 0 < checkpointed < plain
    assert transient == pytest.approx(plain_transient, rel=0.05)  # two layers of the forward run whole
    _, with_reference, _ = sizing.measure_per_token(policy.model, batch[:2], probe, reference=True)
    assert with_reference == pytest.approx(1.5 * transient, rel=0.05)  # the reference's forward: one layer more


def test_auto_micro_batches_train_as_a_fixed_size_does_and_are_reported(base, monkeypatch):
    lines = []
    metrics, weights = {}, {}
    for micro in ("auto", 12):
        policy = make_policy(base, lora=True)
        trainer = TorchTrainer(policy, lr=1e-2, micro_batch=micro, log=lines.append)
        if micro == "auto":
            trainer.sizer.per_token = 1e15  # one row per micro-batch, whatever the machine has free
            trainer.sizer.probed_width = 10**6  # (and no probe to measure it again)
        metrics[micro] = trainer(rollouts(policy, k=4))
        weights[micro] = torch.cat([p.detach().reshape(-1) for p in policy.trainable_parameters()])
    assert metrics["auto"]["train/micro_batch"] == 1 and metrics[12]["train/micro_batch"] == 12
    assert metrics["auto"]["train/memory_estimate_gib"] > metrics["auto"]["train/memory_budget_gib"] > 0
    assert "train/memory_budget_gib" not in metrics[12]
    assert torch.allclose(weights["auto"], weights[12], atol=1e-6)
    assert len(lines) == 1 and lines[0].startswith("train.micro_batch auto: 1 rows")


def test_memory_settings_reach_the_trainer(base):
    from pathlib import Path

    from rlvr.config.run import TrainSection, load_run_config, run_config_from_dict
    from rlvr.errors import ConfigError
    from rlvr.wiring.trainer import make_trainer

    # auto by default for a named base; the tiny model keeps a fixed size (bit-for-bit reproducible runs)
    assert run_config_from_dict({"model": {"base": "some/model"}}).train.micro_batch == "auto"
    assert TrainSection().micro_batch == 256 and not TrainSection().gradient_checkpointing
    for bad in ({"micro_batch": 0}, {"micro_batch": "most"}, {"memory_budget_frac": 0}, {"memory_budget_frac": 1.5},
                {"gradient_checkpointing": "maybe"}):
        with pytest.raises(ConfigError, match=rf"TrainSection\.{next(iter(bad))}"):
            TrainSection(**bad)
    example = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"
    cfg = load_run_config(str(example), ["--train.gradient_checkpointing=true", "--train.memory_budget_frac=0.25",
                                           "--train.micro_batch=auto"])
    policy = make_policy(base, lora=True)
    trainer = make_trainer(cfg, policy)
    assert trainer.gradient_checkpointing and trainer.sizer.budget_frac == 0.25
    assert trainer.sizer.floor_frac == cfg.watchdog.floor_available_frac
    assert trainer.describe()["micro_batch"] == "auto"
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in policy.model.modules())
    with pytest.raises(ValueError, match="train.micro_batch"):
        TorchTrainer(policy, micro_batch=0)
