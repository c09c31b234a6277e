"""Checked before anything is written, in one line naming the key: the model folder or hub name (and the
network a download needs), the device and dtype against this torch, a GGUF spec, a warm start with
nothing to imitate, a session reward sent to worker processes."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.data.tasks import carve, load_tasks  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.wiring import preflight  # noqa: E402

pytestmark = pytest.mark.train


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_cuda_on_a_cpu_torch():
    with pytest.raises(ConfigError, match=r"^model\.device='cuda', but this torch \(.*\) is built without CUDA|"
                                          r"^model\.device='cuda', but this torch \(.*\) sees no CUDA device"):
        preflight.check_device("cuda", "float32", "none")


def test_a_device_torch_does_not_know():
    with pytest.raises(ConfigError, match=r"model\.device='gpu0' is not a device torch knows"):
        preflight.check_device("gpu0", "float32", "none")
    preflight.check_device("cpu", "bfloat16", "bfloat16")  # bf16 on the CPU is fine


def test_a_folder_that_is_missing_or_not_a_model(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.base='.*/nope': no such folder"):
        preflight.check_base(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        preflight.check_base(str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text("{}")
    preflight.check_base(str(tmp_path / "empty"))


def test_a_hub_name_offline_or_unreachable_fails_in_one_line(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub, "try_to_load_from_cache", lambda *a, **k: None)  # not in the local cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE is set"):
        preflight.check_base("someorg/somemodel")
    monkeypatch.delenv("HF_HUB_OFFLINE")

    asked = []

    def unreachable(self, name, timeout=None):
        asked.append(name)
        raise ConnectionError("no route to host")

    monkeypatch.setattr(hub.HfApi, "model_info", unreachable)
    monkeypatch.setenv("RLVR_HUB_RETRIES", "2")  # a transport error is retried (tests/backends/test_hub.py)
    monkeypatch.setenv("RLVR_HUB_BACKOFF_S", "0")
    with pytest.raises(ConfigError) as err:
        preflight.check_base("someorg/somemodel")
    assert "cannot be reached to download it (ConnectionError, 3 attempts)" in str(err.value)
    assert "\n" not in str(err.value) and len(asked) == 3

    def unknown(self, name, timeout=None):
        import httpx
        from huggingface_hub.errors import RepositoryNotFoundError

        raise RepositoryNotFoundError("404", response=httpx.Response(404, request=httpx.Request("GET", "http://hub")))

    monkeypatch.setattr(hub.HfApi, "model_info", unknown)
    with pytest.raises(ConfigError, match="the hub has no such model"):
        preflight.check_base("someorg/somemodel")


def test_a_cached_hub_name_needs_no_network(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub, "try_to_load_from_cache", lambda *a, **k: "/cache/config.json")
    monkeypatch.setattr(hub.HfApi, "model_info", lambda *a, **k: pytest.fail("asked the network"))
    preflight.check_base("someorg/somemodel")


def test_a_gguf_spec_names_what_is_missing():
    with pytest.raises(ConfigError, match="no installed package 'no_such_pkg'"):
        preflight.check_base("gguf:no_such_pkg/model.gguf")
    with pytest.raises(ConfigError, match="no GGUF file at"):
        preflight.check_base("/nonexistent/model.Q4.gguf")


def prompt_only(n: int = 120) -> list[dict]:
    return [{"prompt": f"post {i}"} for i in range(n)]


def test_a_warm_start_with_nothing_to_imitate_is_refused():
    cfg = run_config_from_dict({"task": {"data": "x.jsonl", "rewards": ["trl:r.py:f"]}, "sft": {"steps": 10}})
    split = carve(load_tasks(prompt_only(), require_answer=False), 0.2, "s", 100)
    with pytest.raises(ConfigError, match=r"sft\.steps = 10: the warm start imitates each training row's answer, "
                                          r"and 96 of 96 have none"):
        preflight.check_warm_start(cfg, split)
    preflight.check_warm_start(run_config_from_dict({}), split)  # no warm start: nothing to check


def test_a_warm_start_target_every_training_row_lacks_is_refused_naming_a_row():
    data = [{"prompt": f"q {i}", "answer": str(i), "info": {"solution": f"{i} = {i}\n#### {i}"} if i % 7 else {}}
            for i in range(120)]
    split = carve(load_tasks(data), 0.2, "s", 100)
    cfg = run_config_from_dict({"task": {"data": "x.jsonl"}, "sft": {"steps": 10, "target": "solution"}})
    with pytest.raises(ConfigError, match=r"sft\.target = 'solution': .* have no text there \(row .*, whose info has "
                                          r"no fields\)"):
        preflight.check_warm_start(cfg, split)
    whole = carve(load_tasks([r for r in data if r["info"]]), 0.2, "s", 90)
    preflight.check_warm_start(cfg, whole)  # every row has one: nothing to refuse


def test_a_session_reward_cannot_go_to_worker_processes():
    cfg = run_config_from_dict({"task": {"rewards": ["trl:session:reward_len"], "reward_workers": 2}})
    with pytest.raises(ConfigError, match=r"task\.reward_workers = 2: the reward 'trl:session:reward_len' is a "
                                          "function of this Python session"):
        preflight.check_reward_workers(cfg)
