"""The benchmarks' phase clock: union of overlapping calls, nesting, the per-step split."""

from __future__ import annotations

import pytest

from support.bench_rig import bench_module

phase_timing = bench_module("phase_timing")


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_overlapping_calls_count_once_and_gaps_not_at_all():
    clock = ManualClock()
    phases = phase_timing.PhaseClock(clock)
    phases.start("score")          # t=0
    clock.now = 1.0
    phases.start("score")          # a second reward in another thread
    clock.now = 3.0
    phases.stop("score")
    clock.now = 4.0
    phases.stop("score")           # [0, 4] covered once: 4 s, not 3 + 4
    clock.now = 10.0               # a gap: not counted
    phases.start("score")
    clock.now = 10.5
    phases.stop("score")
    assert phases.total("score") == pytest.approx(4.5)


def test_an_open_interval_counts_up_to_now_and_a_stray_stop_is_an_error():
    clock = ManualClock()
    phases = phase_timing.PhaseClock(clock)
    phases.start("generate")
    clock.now = 2.0
    assert phases.totals() == {"generate": pytest.approx(2.0)}
    phases.stop("generate")
    with pytest.raises(RuntimeError, match="generate"):
        phases.stop("generate")


def test_patch_times_a_method_and_refuses_a_missing_one():
    clock = ManualClock()
    phases = phase_timing.PhaseClock(clock)

    class Optimizer:
        def step(self) -> str:
            clock.now += 0.25
            return "stepped"

    opt = Optimizer()
    phases.patch(opt, "step", "optimizer")
    assert opt.step() == "stepped" and opt.step() == "stepped"
    assert phases.total("optimizer") == pytest.approx(0.5)
    with pytest.raises(AttributeError, match="zero_grad"):
        phases.patch(opt, "zero_grad", "optimizer")


def test_split_per_step_puts_the_uncovered_time_under_other():
    split = phase_timing.split_per_step({"generate": 6.0, "score": 1.0, "forward-backward": 8.0, "optimizer": 1.0,
                                         "ignored": 99.0}, wall_s=20.0, steps=2)
    assert split == {"generate": 3.0, "score": 0.5, "forward-backward": 4.0, "optimizer": 0.5, "sync": 0.0,
                     "other": 2.0}
    assert phase_timing.format_split(split).startswith("generate 3000 ms | score 500 ms")


def test_compare_gives_the_acceptance_ratios(capsys):
    trl_compare = bench_module("trl_compare")
    rlvr = {"curve": [[0, 0.0, 0.2], [5, 10.0, 0.5], [10, 20.0, 0.6]]}
    trl = {"curve": [[0, 0.0, 0.2], [5, 30.0, 0.4], [10, 60.0, 0.5]]}
    ratios = trl_compare.compare(rlvr, trl)
    assert ratios["step"] == pytest.approx(2.0 / 6.0)      # 2 s per step against 6
    assert ratios["best"] == pytest.approx(10.0 / 60.0)    # TRL's best 0.5: rlvr at 10 s, TRL at 60 s
    never = trl_compare.compare({"curve": [[0, 0.0, 0.2], [10, 20.0, 0.3]]}, trl)
    assert never["best"] is None and "rlvr never" in capsys.readouterr().out


def test_the_report_prints_each_library_and_the_mean_ratios(capsys):
    trl_compare = bench_module("trl_compare")
    result = {"curve": [[0, 0.0, 0.2], [2, 8.0, 0.4]], "eval_s": 3.0, "peak_rss_mb": 1234.0,
              "phases": {"generate": 4.0, "score": 0.5, "forward-backward": 3.0, "optimizer": 0.25},
              "settings": {"dtype": "float32", "threads": 2}}
    trl_compare.describe("rlvr", result)
    trl_compare.summarize({0: {"step": 0.5, "best": 0.25}, 1: {"step": 0.7, "best": None}})
    out = capsys.readouterr().out
    assert "4.00 s/step" in out and "peak RSS 1234 MiB" in out
    assert ("generate 2000 ms | score 250 ms | forward-backward 1500 ms | optimizer 125 ms | sync 0 ms | "
            "other 125 ms") in out
    assert "time per step over 2 seed(s): 0.600 ± 0.100 [0.500, 0.700]" in out  # mean ± standard error [range]
    assert "time to TRL's best over 1 of 2 seed(s): 0.250;" in out


def test_eval_gate_waits_for_generation_in_flight_and_holds_new_generation_until_done():
    import threading
    import time

    gate = bench_module("compare_runs").EvalGate()
    log, started, release, evaluated = [], threading.Event(), threading.Event(), threading.Event()

    def generate(tag):
        log.append(f"gen {tag}")
        started.set()
        release.wait(5)
        log.append(f"gen {tag} done")

    def evaluate():
        with gate.evaluation():
            log.append("eval")
            evaluated.wait(5)
            log.append("eval done")

    def logged(entry):  # waits as long as a loaded machine needs; a wrong order still shows at once
        deadline = time.monotonic() + 30
        while entry not in log and time.monotonic() < deadline:
            time.sleep(0.005)
        return log

    threads = [threading.Thread(target=gate.generation(generate), args=("a",))]
    threads[0].start()
    started.wait(5)
    threads.append(threading.Thread(target=evaluate))
    threads[1].start()
    time.sleep(0.1)
    assert log == ["gen a"]  # the evaluation waits for the generation in flight
    release.set()
    assert logged("eval") == ["gen a", "gen a done", "eval"]
    threads.append(threading.Thread(target=gate.generation(generate), args=("b",)))
    threads[2].start()
    time.sleep(0.1)
    assert log == ["gen a", "gen a done", "eval"]  # no new generation while evaluating
    evaluated.set()
    for t in threads:
        t.join(5)
    assert log == ["gen a", "gen a done", "eval", "eval done", "gen b", "gen b done"]


def test_eval_clock_counts_run_time_from_start_and_takes_evaluations_out(monkeypatch):
    from types import SimpleNamespace

    compare_runs = bench_module("compare_runs")
    clock = ManualClock()  # the machine's load cannot stretch what is measured

    def score():
        clock.now += 0.05  # the evaluation's own time
        return 0.5

    monkeypatch.setattr(compare_runs, "time", SimpleNamespace(perf_counter=clock))
    eval_clock = compare_runs.EvalClock("x", score)
    eval_clock.start()
    clock.now += 0.25  # e.g. waiting for the first batch's generation before the step-0 evaluation
    eval_clock.evaluate(0)
    clock.now += 0.5
    eval_clock.evaluate(1)
    assert eval_clock.curve == [(0, pytest.approx(0.25), 0.5), (1, pytest.approx(0.75), 0.5)]
    assert eval_clock.eval_s == pytest.approx(0.1)  # both evaluations taken out
