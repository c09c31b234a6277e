"""Reward models (``rm:`` in ``task.rewards``): the score is the classifier's own output on the
rendered conversation, batching changes no score, concurrent calls share forward passes, and every
misconfiguration is refused naming the spec."""

from __future__ import annotations

import math
import threading

import pytest

pytestmark = pytest.mark.train
torch = pytest.importorskip("torch")

from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

from rlvr.backends.model.reward_model import RewardModel, parse_rm_spec  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_classifier  # noqa: E402
from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.errors import ConfigError, RewardError  # noqa: E402
from rlvr.reward import evaluate_reward  # noqa: E402

CONVERSATIONS = [
    [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}],
    [{"role": "user", "content": "12+30="}, {"role": "assistant", "content": "42 and more text"}],
    [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}],
]


@pytest.fixture(scope="module")
def one_logit(tmp_path_factory):
    return build_tiny_classifier(tmp_path_factory.mktemp("rm1"), hidden=16, heads=2, seed=1)


@pytest.fixture(scope="module")
def three_labels(tmp_path_factory):
    return build_tiny_classifier(tmp_path_factory.mktemp("rm3"), hidden=16, heads=2, num_labels=3, seed=2,
                                 max_positions=24)


def direct_logits(folder, messages) -> list[float]:
    """The classifier's logits for one conversation, read without the reward model's code."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    ids = tok(tok.apply_chat_template(messages, tokenize=False), return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**ids).logits[0].tolist()


def test_the_score_is_the_single_logit_and_batching_changes_no_score(one_logit):
    rm = RewardModel(str(one_logit), batch_size=8, max_wait_ms=0)
    try:
        alone = [rm.reward_fn(m) for m in CONVERSATIONS]
        assert alone == pytest.approx([direct_logits(one_logit, m)[0] for m in CONVERSATIONS], abs=1e-5)
        together = rm.score_texts([rm.render(m) for m in CONVERSATIONS])  # padded to the longest
        assert together == pytest.approx(alone, abs=1e-5)
    finally:
        rm.close()


def test_a_labelled_classifier_scores_the_probability_of_its_label(three_labels):
    logits = direct_logits(three_labels, CONVERSATIONS[0])
    by_hand = math.exp(logits[2]) / sum(math.exp(v) for v in logits)
    rm = RewardModel(str(three_labels), label=2)
    try:
        assert rm.reward_fn(CONVERSATIONS[0]) == pytest.approx(by_hand, abs=1e-6)
        long = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "x" * 40}]
        with pytest.raises(RewardError, match=r"a conversation of \d+ tokens exceeds its context of 24"):
            rm.reward_fn(long)
    finally:
        rm.close()
    with pytest.raises(ConfigError, match=r"the model has 3 labels; say which one scores"):
        RewardModel(str(three_labels))
    with pytest.raises(ConfigError, match=r"label=3 but the model has 3 label"):
        RewardModel(str(three_labels), label=3)


def test_concurrent_calls_share_forward_passes(one_logit):
    rm = RewardModel(str(one_logit), batch_size=4, max_wait_ms=500)
    results: dict[int, float] = {}
    try:
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, rm.reward_fn(CONVERSATIONS[i % 3])))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sum(rm.batches) == 8 and max(rm.batches) == 4  # closed at batch_size, not one pass per call
        singles = [direct_logits(one_logit, CONVERSATIONS[i % 3])[0] for i in range(3)]
        assert [results[i] for i in range(8)] == pytest.approx([singles[i % 3] for i in range(8)], abs=1e-5)
    finally:
        rm.close()


def test_a_spec_s_options_are_parsed_and_bad_ones_refused(tmp_path):
    assert parse_rm_spec("rm:org/sentiment?label=1&batch_size=4") == ("org/sentiment", {"label": 1, "batch_size": 4})
    with pytest.raises(ConfigError, match=r"unknown option 'lable'"):
        parse_rm_spec("rm:x?lable=1")
    with pytest.raises(ConfigError, match=r"batch_size='many' is not a int"):
        parse_rm_spec("rm:x?batch_size=many")
    with pytest.raises(ConfigError, match=r"no sequence-classification model loads from it"):
        RewardModel(str(tmp_path / "missing"))


def test_task_rewards_take_a_reward_model_recorded_under_its_name(one_logit, tmp_path):
    from rlvr.envs.trl import rewards_env
    from rlvr.wiring.reward_models import reward_loader

    spec = f"rm:{one_logit}"
    env = rewards_env([spec, "exact_match"], [0.5, 1.0], load=reward_loader("cpu"))
    result = evaluate_reward(env, CONVERSATIONS[0], "7")
    score = direct_logits(one_logit, CONVERSATIONS[0])[0]
    assert result.metrics[one_logit.name] == pytest.approx(score, abs=1e-5)  # recorded as reward/<folder name>
    assert result.metrics["exact_match"] == 1.0
    assert result.value == pytest.approx(0.5 * score + 1.0, abs=1e-5)  # reward_weights apply as to any component
    with pytest.raises(ConfigError, match=r"is a reward model, scored in batches on the policy's device"):
        run_config_from_dict({"task": {"data": "x.jsonl", "name": None, "rewards": [spec], "reward_workers": 2}})
    with pytest.raises(ConfigError, match=r"a reward model is a reward, not an environment"):
        run_config_from_dict({"task": {"env": spec}})
