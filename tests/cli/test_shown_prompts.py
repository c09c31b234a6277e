"""``[task] system_prompt`` and ``chat_template_kwargs``: rows are shown with the system message and
rendered with the template variables everywhere a run shows or renders them (training, held-out,
eval sets, the warm start, ``rlvr eval``), so a TRL-style reward sees the messages the model saw; the
split stays the rows'."""

from __future__ import annotations

import dataclasses

import pytest

from rlvr.config.run import run_config_from_dict
from rlvr.data.tasks import carve, load_tasks, with_system_prompt

SYSTEM = "Answer with digits."
# The tiny model's template, plus what a thinking model's does with enable_thinking = false after the
# generation prompt (an empty think block; a newline stands in for it here).
THINKING_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '\n' }}{% endif %}{% endif %}"
)


def test_a_system_prompt_leads_the_messages_and_leaves_the_hash_and_a_row_s_own_alone():
    (task,) = load_tasks([{"prompt": "1+1=", "answer": "2"}])
    shown = with_system_prompt(task, SYSTEM)
    assert shown.messages == ({"role": "system", "content": SYSTEM}, *task.messages)
    assert shown.content_hash == task.content_hash
    assert with_system_prompt(shown, "Another.") == shown  # a row with its own system message keeps it
    assert with_system_prompt(task, None) is task


def test_the_split_is_carved_from_the_rows_whatever_they_are_shown_with():
    pytest.importorskip("torch")
    from rlvr.wiring.levers import shown_split

    tasks = load_tasks([{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(40)])
    split = carve(tasks, 0.25, "salt", 20)
    cfg = run_config_from_dict({"task": {"name": "addition", "system_prompt": SYSTEM}})
    shown = shown_split(cfg, split)
    assert shown.manifest == split.manifest and [t.id for t in shown.heldout] == [t.id for t in split.heldout]
    assert all(t.messages[0]["content"] == SYSTEM for t in (*shown.train, *shown.heldout))
    envs = run_config_from_dict({"envs": {"a": {"name": "addition", "system_prompt": SYSTEM},
                                          "b": {"name": "addition"}}})
    tagged = [dataclasses.replace(t, env=("a" if i % 2 else "b")) for i, t in enumerate(tasks)]
    from rlvr.wiring.levers import shown as shown_tasks

    assert {t.env: t.messages[0]["role"] for t in shown_tasks(envs, tagged)} == {"a": "system", "b": "user"}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pytest.importorskip("torch")
    from rlvr.backends.model.io import load_tokenizer
    from rlvr.backends.model.tiny import build_tiny_model

    base = build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=16, layers=1, heads=2, seed=0)
    tok = load_tokenizer(str(base))
    tok.chat_template = THINKING_TEMPLATE
    return tok


def test_template_kwargs_reach_every_rendering_training_and_warm_start_alike(tokenizer):
    from rlvr.backends.model.tokenizer import HFChatTokenizer
    from rlvr.backends.train.sft import encode_example

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "1+1="}]
    plain = HFChatTokenizer(tokenizer).render(messages)
    rendered = HFChatTokenizer(tokenizer, template_kwargs={"enable_thinking": False})
    ids = rendered.render(messages)
    assert ids == plain + tokenizer("\n", add_special_tokens=False)["input_ids"]
    example, mask = encode_example(tokenizer, {"prompt": messages, "answer": "2"},
                                   template_kwargs={"enable_thinking": False})
    assert example[: len(ids)] == ids and mask[: len(ids)] == [0] * len(ids)


REWARD = f'''
def saw_the_system_prompt(prompts, completions, **kwargs):
    """1 when the prompt the reward is given starts with the run's system prompt, else 0."""
    def seen(p):
        return p.startswith({SYSTEM!r}) if isinstance(p, str) else p[0] == {{"role": "system", "content": {SYSTEM!r}}}
    return [1.0 if seen(p) else 0.0 for p in prompts]
'''


def test_a_run_shows_its_rows_with_the_system_prompt_to_the_trainer_and_the_rewards(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    from rlvr.backends.model import tiny
    from rlvr.backends.model.tokenizer import HFChatTokenizer
    from rlvr.wiring.seams import make_loop

    monkeypatch.setattr(tiny, "CHAT_TEMPLATE", THINKING_TEMPLATE)
    (tmp_path / "reward.py").write_text(REWARD)
    cfg = run_config_from_dict({
        "loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                 "heldout_frac": 0.2},
        "model": {"hidden": 16, "layers": 1, "heads": 2, "threads": 1},
        "task": {"name": "addition", "n": 30, "rewards": [f"trl:{tmp_path / 'reward.py'}:saw_the_system_prompt"],
                 "system_prompt": SYSTEM, "chat_template_kwargs": {"enable_thinking": False}},
        "sft": {"steps": 0}, "sampler": {"max_new_tokens": 2}})
    loop = make_loop(cfg, tmp_path / "run", log=lambda _m: None)
    seen: list = []
    train = loop.trainer

    def capture(batch):
        seen.extend(batch.rollouts)
        return train(batch)

    loop.trainer = capture
    record = loop.run()
    # The TRL-style reward saw the system prompt on every training sample and every held-out row.
    assert record.pool_scores[1] == 1.0 and record.heldout_scores == {0: 1.0, 1: 1.0}
    tokenizer = HFChatTokenizer(train.policy.tokenizer, template_kwargs={"enable_thinking": False})
    first = seen[0]
    assert first.messages[0] == {"role": "system", "content": SYSTEM}
    assert list(first.prompt_ids) == tokenizer.render(first.messages[:-1])
