"""Custom policy losses named by an import spec: loading, checking, calling, and the config keys."""

from __future__ import annotations

import pickle
import sys
import textwrap

import pytest

pytestmark = pytest.mark.train
torch = pytest.importorskip("torch")

from rlvr.backends.train.losses import LossConfig, LossInputs, compute_loss  # noqa: E402
from rlvr.backends.train.losses import custom as custom_module  # noqa: E402

PARAM_NAMES = {"clip_eps_low", "clip_eps_high", "dual_clip", "cispo_cap", "dro_beta", "dppo_mask_low",
               "dppo_mask_high", "dppo_adv_tau", "dppo_kl_tau"}

# A REINFORCE-in-ratio-form loss (grpo's) with a scale, recording what it was called with.
LOSS_SOURCE = textwrap.dedent('''
    import torch

    CALLS = []

    def loss(logp, old_logp, adv, mask, scale=1.0, **params):
        CALLS.append({"scale": scale, **params})
        tokens = -adv * torch.exp(logp - old_logp) * scale
        return tokens, {"positive": (adv > 0).to(torch.float32)}

    def bare(logp, old_logp, adv, mask):
        return -adv * logp, {}

    def wrong_shape(logp, old_logp, adv, mask, **params):
        return (-adv * logp).sum(-1), {}

    def not_a_pair(logp, old_logp, adv, mask, **params):
        return -adv * logp

    NOT_CALLABLE = 3
''')


@pytest.fixture
def loss_file(tmp_path):
    path = tmp_path / "my_loss.py"
    path.write_text(LOSS_SOURCE)
    return path


@pytest.fixture
def loss_module(tmp_path, monkeypatch):
    (tmp_path / "my_loss_mod.py").write_text(LOSS_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_loss_mod", raising=False)
    return "my_loss_mod"


def batch() -> LossInputs:
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -0.7, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.1, -0.4, -2.0], [-0.3, -0.9, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    return LossInputs(logp=logp, old_logp=old, advantages=adv, rl_weight=mask)


def test_a_file_spec_loss_gives_the_builtin_result_and_reports_its_diagnostics(loss_file):
    x = batch()
    ours = compute_loss(x, LossConfig(policy_loss=f"{loss_file}:loss"))
    builtin = compute_loss(x, LossConfig(policy_loss="grpo"))
    assert ours.loss.item() == pytest.approx(builtin.loss.item())
    (g_ours,) = torch.autograd.grad(ours.loss, x.logp)
    (g_builtin,) = torch.autograd.grad(builtin.loss, x.logp)
    torch.testing.assert_close(g_ours, g_builtin)
    assert ours.metrics["train/positive"] == pytest.approx(3 / 5)  # mean over the 5 rl tokens
    assert ours.metrics["train/clip_frac"] == 0.0


def test_an_import_spec_loss_gets_the_policy_loss_params_and_its_kwargs(loss_module):
    cfg = LossConfig(policy_loss=f"{loss_module}:loss", policy_loss_kwargs={"scale": 2.0})
    x = batch()
    doubled = compute_loss(x, cfg).loss.item()
    assert doubled == pytest.approx(2 * compute_loss(x, LossConfig()).loss.item())
    (call,) = sys.modules[loss_module].CALLS
    assert call == {"scale": 2.0, **dict.fromkeys(PARAM_NAMES)} == {"scale": 2.0, **cfg.policy_loss_params()}


def test_a_custom_loss_is_resolved_once_per_config(loss_file, monkeypatch):
    loads = []
    real = custom_module.load_object
    monkeypatch.setattr(custom_module, "load_object", lambda spec: loads.append(spec) or real(spec))
    cfg = LossConfig(policy_loss=f"{loss_file}:loss")
    first = cfg.policy_loss_fn
    for _ in range(3):
        compute_loss(batch(), cfg)
    assert loads == [f"{loss_file}:loss"] and cfg.policy_loss_fn is first


def test_a_custom_loss_defaults_to_token_mean_and_keeps_an_explicit_mode(loss_file):
    assert LossConfig(policy_loss=f"{loss_file}:loss").aggregation == "token-mean"
    explicit = LossConfig(policy_loss=f"{loss_file}:loss", aggregation="seq-mean-token-mean")
    assert explicit.aggregation == "seq-mean-token-mean"


@pytest.mark.parametrize(("attr", "needle"), [
    ("missing", "defines no 'missing'"),
    ("NOT_CALLABLE", "is a int, not a function"),
    ("bare", "cannot be called as fn"),  # no **params: would fail at the first step
])
def test_a_bad_custom_loss_fails_when_the_config_is_built(loss_file, attr, needle):
    with pytest.raises(ValueError, match="LossConfig.policy_loss:") as info:
        LossConfig(policy_loss=f"{loss_file}:{attr}")
    assert needle in str(info.value)


@pytest.mark.parametrize(("spec", "needle"), [
    ("no_such_module_xyz:loss", "no module named 'no_such_module_xyz'"),
    ("/no/such/file.py:loss", "no such file"),
    ("grpoo", "is not one of"),
    ("package.module", "is not one of"),  # a custom loss must name its function
])
def test_a_spec_that_does_not_import_is_refused(spec, needle):
    with pytest.raises(ValueError, match="LossConfig.policy_loss:") as info:
        LossConfig(policy_loss=spec)
    assert needle in str(info.value)


@pytest.mark.parametrize(("kwargs", "field", "needle"), [
    ({"clip_eps_low": 0.1}, "clip_eps_low", "policy_loss_kwargs"),  # variant fields are refused
    ({"cispo_cap": 5.0}, "cispo_cap", "is not used by"),
    ({"policy_loss_kwargs": {"dual_clip": 3.0}}, "policy_loss_kwargs", "already passed"),
    ({"policy_loss_kwargs": {"scale": [1, 2]}}, "policy_loss_kwargs", "scalars"),
    ({"policy_loss_kwargs": {"not an identifier": 1}}, "policy_loss_kwargs", "identifier"),
])
def test_custom_loss_settings_are_checked(loss_file, kwargs, field, needle):
    with pytest.raises(ValueError, match=f"LossConfig.{field}") as info:
        LossConfig(policy_loss=f"{loss_file}:loss", **kwargs)
    assert needle in str(info.value)


def test_kwargs_are_refused_for_a_builtin_loss():
    with pytest.raises(ValueError, match="LossConfig.policy_loss_kwargs: only a custom policy loss"):
        LossConfig(policy_loss="ppo", policy_loss_kwargs={"scale": 2.0})


@pytest.mark.parametrize(("attr", "error", "needle"), [
    ("wrong_shape", ValueError, r"loss_tokens \(2,\)"),
    ("not_a_pair", TypeError, "return \\(loss_tokens, diagnostics\\)"),
])
def test_what_a_custom_loss_returns_is_checked(loss_file, attr, error, needle):
    cfg = LossConfig(policy_loss=f"{loss_file}:{attr}")
    with pytest.raises(error, match=needle):
        compute_loss(batch(), cfg)


def test_a_config_with_a_custom_loss_pickles_by_reloading_it(loss_file):
    cfg = LossConfig(policy_loss=f"{loss_file}:loss", policy_loss_kwargs={"scale": 0.5})
    copy = pickle.loads(pickle.dumps(cfg))
    assert copy == cfg and copy.policy_loss_fn is not cfg.policy_loss_fn
    assert compute_loss(batch(), copy).loss.item() == pytest.approx(compute_loss(batch(), cfg).loss.item())


# ---- [train] keys through loss_config ----------------------------------------------------------


def test_train_keys_reach_the_loss_config(loss_file):
    from rlvr.config.run import load_run_config
    from rlvr.wiring.levers import loss_config

    cfg = loss_config(load_run_config(None, [f"--train.policy_loss='{loss_file}:loss'",
                                             "--train.policy_loss_kwargs={scale = 3}"]))
    assert cfg.policy_loss == f"{loss_file}:loss" and dict(cfg.policy_loss_kwargs) == {"scale": 3}
    assert cfg.aggregation == "token-mean"


@pytest.mark.parametrize(("overrides", "aggregation"), [
    (["--train.policy_loss=gspo"], "seq-mean-token-mean"),
    (["--train.policy_loss=gspo", "--train.aggregation=token-mean"], "token-mean"),
    (["--train.policy_loss=grpo"], "token-mean"),
    ([], "token-mean"),
])
def test_aggregation_unset_is_the_policy_loss_default(overrides, aggregation):
    from rlvr.config.run import load_run_config
    from rlvr.wiring.levers import loss_config

    assert loss_config(load_run_config(None, overrides)).aggregation == aggregation


@pytest.mark.parametrize(("overrides", "needle"), [
    (["--train.policy_loss=no_such_module_xyz:loss"], "train.policy_loss: 'no_such_module_xyz:loss' does not load"),
    (["--train.policy_loss=gpro"], "train.policy_loss: 'gpro' is not one of"),
    (["--train.policy_loss_kwargs={scale = 2}"], "train.policy_loss_kwargs: only a custom policy loss"),
])
def test_a_bad_policy_loss_fails_at_load_naming_the_train_key(overrides, needle):
    from rlvr.config.run import load_run_config
    from rlvr.errors import ConfigError
    from rlvr.wiring.levers import loss_config

    with pytest.raises(ConfigError) as info:
        loss_config(load_run_config(None, overrides))
    assert needle in str(info.value)
