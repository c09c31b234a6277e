"""What the remote-rollout tests share: a fake run over any rollout function, and its record made
comparable with a local run's (the rollout seam's own description, the workers' warning events and
the checkpoints' record offsets, which count those events, left out). Standard library + rlvr's fakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import record_files, small_config
from rlvr import RLLoop
from rlvr.testing import FakeTrainer, ScriptedEvaluator, exact_match, make_rows


def run(out: Path, rollout_fn: Any, **overrides: Any) -> RLLoop:
    loop = RLLoop(small_config(**overrides), exact_match, make_rows(40), rollout_fn=rollout_fn,
                  trainer=FakeTrainer(), heldout_eval=ScriptedEvaluator(lambda s: 0.1 + 0.01 * s), out_dir=out)
    loop.run()
    return loop


def comparable(out: Path) -> dict[str, list[str]]:
    files = record_files(out)
    info = json.loads(files["run.json"][0])
    info["seams"].pop("rollout_fn")
    files["run.json"] = [json.dumps(info, sort_keys=True)]
    files["events.jsonl"] = [e for e in files["events.jsonl"] if '"kind": "warning"' not in e]
    for name in [n for n in files if n.startswith("checkpoints/")]:
        state = json.loads(files[name][0])
        state.pop("record_offsets")
        files[name] = [json.dumps(state, sort_keys=True)]
    return files
