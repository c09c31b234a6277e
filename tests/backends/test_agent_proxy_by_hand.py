"""The by-hand recipe of docs/agents.md as written: ``rlvr serve MODEL`` (which serves the model under
its path) and ``rlvr proxy MODEL --url ...`` with no model name: the proxy asks the server which
model it serves, so the agent's call is answered, not refused 404. ``--chat-template FILE`` renders
with that template; ``model.chat_template`` does the same for a run."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rlvr.backends.model.io import load_tokenizer  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.model.tokenizer import chat_template_text, use_chat_template  # noqa: E402
from rlvr.backends.sample.http import served_model  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.config.run import RunConfig  # noqa: E402
from rlvr.errors import BackendError, ConfigError  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402
from rlvr.wiring.scale.rollout_workers import setup_spec  # noqa: E402
from rlvr.wiring.trainer import make_policy  # noqa: E402

pytestmark = pytest.mark.train
TEMPLATE = "{% for m in messages %}{{ m['content'] }}={% endfor %}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)
    with serve_in_thread(ModelHost(str(base)), port=free_port()) as url:  # as `rlvr serve MODEL`: named by its path
        yield base, url


def test_the_proxy_asks_the_server_which_model_it_serves(served):
    base, url = served
    assert served_model(url) == str(base) == served_model(f"{url}/v1")
    with pytest.raises(BackendError, match="--served-model-name"):
        served_model(f"http://127.0.0.1:{free_port()}", timeout_s=2)


def test_the_docs_recipe_answers_and_records(served, tmp_path):
    base, url = served
    (tmp_path / "template.jinja").write_text(TEMPLATE)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "proxy", str(base), "--url", url, "--port", str(port),
                             "--render-workers", "1", "--chat-template", str(tmp_path / "template.jinja"),
                             "--record", str(tmp_path / "sessions.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        proxy, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-2000:]
            try:
                if httpx.get(f"{proxy}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        messages = [{"role": "user", "content": "12+3"}]
        r = httpx.post(f"{proxy}/s/try1/v1/chat/completions", timeout=180,
                       json={"model": "policy", "messages": messages, "max_tokens": 4, "return_token_ids": True})
        assert r.status_code == 200, r.text
        tok = load_tokenizer(str(base))
        assert r.json()["prompt_token_ids"] == tok("12+3=", add_special_tokens=False)["input_ids"]  # --chat-template
        closed = httpx.post(f"{proxy}/sessions/try1/close", timeout=30).json()
        assert len(closed["calls"]) == 1
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert (tmp_path / "sessions.jsonl").read_text().count("\n") == 1


def test_a_runs_chat_template_is_a_file_or_the_text(served, tmp_path):
    base, _ = served
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    assert chat_template_text(str(tmp_path / "t.jinja"), "model.chat_template") == TEMPLATE
    assert chat_template_text(TEMPLATE, "model.chat_template") == TEMPLATE
    with pytest.raises(ConfigError, match="model.chat_template='nowhere.jinja': no such file"):
        chat_template_text("nowhere.jinja", "model.chat_template")
    (tmp_path / "plain.txt").write_text("hello")
    with pytest.raises(ConfigError, match="not a Jinja chat template"):
        chat_template_text(str(tmp_path / "plain.txt"), "model.chat_template")
    tok = use_chat_template(load_tokenizer(str(base)), str(tmp_path / "t.jinja"), "model.chat_template")
    assert tok.apply_chat_template([{"role": "user", "content": "1"}], tokenize=False) == "1="
    cfg = RunConfig.model_validate({"model": {"tiny": True, "chat_template": str(tmp_path / "t.jinja"),
                                              "tool_parser": "mistral"}})
    assert cfg.model.tool_parser == "mistral"
    policy = make_policy(cfg, base)  # every prompt of the run renders with it, and checkpoints keep it
    assert policy.tokenizer.apply_chat_template([{"role": "user", "content": "2"}], tokenize=False) == "2="
    spec = setup_spec(cfg, cfg.task, base, SamplingParams(max_tokens=4))  # rollout workers: the text travels
    assert spec["kwargs"]["chat_template"] == TEMPLATE
