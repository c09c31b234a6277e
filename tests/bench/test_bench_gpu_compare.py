"""The GPU benchmark: its figures (hand-computed), its config (the measured step's shapes, valid for
``rlvr train``), its task, its profile summary, and a whole run of ``--shape tiny`` on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the bench modules import one another by name
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gpu_compare = load("gpu_compare")


def test_sampling_time_counts_the_union_of_calls_inside_the_window():
    calls = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (9.0, 12.0), (20.0, 21.0)]
    # inside [1, 10]: [1, 3] once though two calls cover it, [5, 6], [9, 10]; [20, 21] is outside
    assert gpu_compare.union_within(calls, 1.0, 10.0) == pytest.approx(2.0 + 1.0 + 1.0)
    assert gpu_compare.union_within([], 0.0, 5.0) == 0.0


def test_the_bandwidth_floor_of_the_measured_model():
    # 1.7b: 1,711,376,384 bf16 parameters (3.19 GiB); 128 decode steps at 4.3 TB/s read them in 0.10 s
    weight_bytes = 1_711_376_384 * 2
    assert weight_bytes / 2**30 == pytest.approx(3.19, abs=0.005)
    assert gpu_compare.bandwidth_floor(128, weight_bytes, 4.3e12) == pytest.approx(0.1019, abs=1e-4)


def test_the_1_7b_shape_is_smollm2_1_7b():
    torch = pytest.importorskip("torch")
    from transformers import LlamaForCausalLM

    config = load("gpu_legs").llama_config(gpu_compare.SHAPES["1.7b"], 1, 2, 2)
    with torch.device("meta"):  # no memory: only the parameter shapes
        model = LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 1_711_376_384
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_rlvr_figures_drop_the_warm_up_and_split_rollouts_from_held_out():
    steps = [{"step": s, "step_s": t, "wait_s": w, "train_s": 1.0, "sync_s": 0.1, "completion_len": 128.0,
              "reward_std": 0.5} for s, t, w in ((1, 30.0, 25.0), (2, 10.0, 8.0), (3, 12.0, 9.0))]
    calls = [{"start": 100.0, "end": 125.0, "temperature": 1.0},   # step 1's batch: warm-up, outside the window
             {"start": 129.0, "end": 137.0, "temperature": 1.0},   # step 2's batch (from 130 on inside)
             {"start": 138.0, "end": 140.0, "temperature": 1.0},   # step 3's, in two calls
             {"start": 139.0, "end": 146.0, "temperature": 1.0},
             {"start": 141.0, "end": 142.5, "temperature": 0.0}]   # greedy: held-out
    result = {"steps": steps, "step_ends": {"1": 130.0, "2": 140.0, "3": 152.0}, "calls": calls}
    f = gpu_compare.rlvr_figures(result, warmup=1)
    assert f["step_s"] == [10.0, 12.0]
    assert f["wait_s"] == pytest.approx(8.5) and f["train_s"] == 1.0
    assert f["sampling_s"] == pytest.approx((7.0 + 8.0) / 2)  # [130, 137] + [138, 146], per measured step
    assert f["heldout_s"] == pytest.approx(1.5)
    with pytest.raises(SystemExit, match="none after the 3 warm-up steps"):
        gpu_compare.rlvr_figures(result, warmup=3)
    unseen = gpu_compare.rlvr_figures({**result, "calls": calls[-1:]}, warmup=1)
    assert unseen["sampling_s"] is None  # no sampled call timed: unknown, not zero


def test_the_report_prints_each_library_and_the_ratios(capsys):
    args = gpu_compare.parse_args(["--shape", "tiny", "--steps", "2", "--new-tokens", "128"])
    results = {
        "build": {"params": 3_300_000, "weight_bytes": 2**23, "device_name": "CPU"}, "versions": {},
        "rlvr": {"steps": [{"step": s, "step_s": 2.0 * s, "wait_s": 1.0, "train_s": 0.5, "sync_s": 0.0,
                            "completion_len": 128.0} for s in (1, 2, 3)],
                 "step_ends": {"1": 10.0, "2": 14.0, "3": 20.0},
                 "calls": [{"start": 11.0, "end": 13.0, "temperature": 1.0}, {"start": 15.0, "end": 17.0,
                                                                                  "temperature": 1.0}],
                 "peak_mb": 1024.0, "peak_kind": "peak RSS"},
        "trl": {"steps": [{"step": s, "step_s": 10.0, "generate_s": 6.0} for s in (1, 2, 3)], "trl": "1.16.0",
                "completion_len": 128.0, "peak_mb": 2048.0, "peak_kind": "peak RSS"},
        "generate": {"seconds": {"plain": 1.0, "rlvr": 1.5, "plain_base": 0.9}, "rows": 128,
                     "prompt_tokens": [40, 42], "rlvr_completion_len": 128.0, "bandwidth": 2**30,
                     "nominal_bandwidth": None, "peak_mb": 512.0, "peak_kind": "peak RSS"},
    }
    ratios = gpu_compare.report(results, args)
    assert ratios["rlvr/trl"] == pytest.approx(5.0 / 10.0)          # median of 4 s and 6 s, against 10 s
    assert ratios["sampling/plain"] == pytest.approx(2.0 / 1.0)     # 4 s of calls in 2 measured steps
    assert ratios["sample_batch/plain"] == pytest.approx(1.5)
    assert ratios["plain/floor"] == pytest.approx(1.0 / (128 * 2**23 / 2**30))
    out = capsys.readouterr().out
    assert "rlvr  time per step   4.00 / 6.00 s (median 5.00)" in out
    assert "rlvr / TRL, time per step" in out and "0.500x  (goal <= 0.6)" in out
    assert "peak memory 2.00 GiB (peak RSS)" in out


def test_the_config_is_the_measured_step_and_loads_as_rlvr_train_reads_it(tmp_path):
    from rlvr.config.run import load_run_config

    args = gpu_compare.parse_args(["--shape", "1.7b"])
    assert (args.device, args.dtype) == ("cuda", "bfloat16")
    path = tmp_path / "config.toml"
    gpu_compare.write_toml(path, gpu_compare.bench_config(args, str(tmp_path / "model"), args.dtype, args.steps))
    cfg = load_run_config(path)
    assert (cfg.loop.tasks_per_step, cfg.loop.group_k, cfg.sampler.max_new_tokens) == (16, 8, 128)
    assert (cfg.train.micro_batch, cfg.loop.lora_rank, cfg.loop.kl_coef) == (32, 16, 0.0)
    assert (cfg.model.device, cfg.model.dtype, cfg.loop.max_steps) == ("cuda", "bfloat16", 4)
    assert cfg.loop.heldout_every == cfg.loop.max_steps  # no held-out inside a measured step


def test_the_task_rewards_the_reply_length_parity():
    env = load("gpu_compare_env")
    rows = env.make_rows(120, seed=0)
    assert len({r["prompt"] for r in rows}) == 120
    assert env.reward_fn([{"role": "assistant", "content": "ab"}], "even").value == 1.0
    assert env.reward_fn([{"role": "assistant", "content": "abc"}], "even").value == 0.0


def test_the_profile_summary_counts_threads_and_leaves_imports_out():
    summary = load("profile_summary")
    raw = ("thread (1): MainThread;<module> (bench/x.py:3);_find_and_load (<frozen importlib._bootstrap>:1) 5\n"
           "thread (2): rlvr-engine;InProcessEngine._work (rlvr/backends/sample/engine.py:150);"
           "SeededSampling.__call__ (rlvr/backends/sample/batched.py:98) 3\n"
           "thread (2): rlvr-engine;InProcessEngine._work (rlvr/backends/sample/engine.py:151) 2\n")
    threads, inclusive, leaves, imports, total = summary.parse(raw)
    assert (total, imports) == (10, 5)
    assert threads == {"MainThread": 5, "rlvr-engine": 5}
    assert inclusive["InProcessEngine._work (rlvr/backends/sample/engine.py)"] == 5
    assert leaves["SeededSampling.__call__ (rlvr/backends/sample/batched.py)"] == 3


@pytest.mark.slow
def test_the_benchmark_runs_on_the_cpu_with_the_tiny_shape(tmp_path):
    from support.smollm2_rig import smollm2_dir

    tokenizer = smollm2_dir()  # the converted GGUF folder holds SmolLM2's tokenizer
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(BENCH / "gpu_compare.py"), "--shape", "tiny", "--device", "cpu", "--steps", "1",
           "--warmup", "1", "--prompts", "2", "--samples", "2", "--new-tokens", "4", "--micro-batch", "4",
           "--repeats", "1", "--threads", "1", "--tokenizer", str(tokenizer), "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["build"]["params"] > 3_000_000  # the real vocabulary: 49152 x 64 embeddings alone
    assert len(figures["rlvr_figures"]["step_s"]) == 1 and figures["rlvr_figures"]["sampling_s"] > 0
    assert figures["generate"]["seconds"]["plain"] > 0 and figures["generate"]["bandwidth"] > 0
    assert {"sampling/plain", "sample_batch/plain", "plain/floor"} <= set(figures["ratios"])
    if importlib.util.find_spec("trl") is not None:
        assert len(figures["trl_figures"]["step_s"]) == 1 and "rlvr/trl" in figures["ratios"]
        assert "rlvr / TRL, time per step" in done.stdout
    else:
        assert "TRL   skipped: trl" in done.stdout
    assert "bandwidth floor" in done.stdout
