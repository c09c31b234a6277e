"""The trainer's side of the token export (the layout and its reader: :mod:`rlvr.record.token_exports`).

:class:`TokenExport` is handed to a trainer; the trainer tells it when a call begins (``begin``), which
optimizer step of the call it is on (``at``), each micro-batch's forward (``add``: the packed batch with
its rollouts, the live log-probs and entropies, the snapshot's log-probs) and when the call's optimizer
steps are done (``finish``). Records are written as the micro-batches are read, before their optimizer
step, so ``trainer_logprobs`` are the weights the gradient was taken at. :data:`NO_EXPORT` is the same
interface doing nothing, so a trainer calls it unconditionally.

A backend module: imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import torch

from rlvr.record.token_exports import marker_file, records_file


def _row(values: torch.Tensor | None, b: int, n: int) -> list[float] | None:
    return None if values is None else [round(float(v), 6) for v in values[b, :n].tolist()]


class TokenExport:
    """Writes this rank's records of each step under ``root`` (see :mod:`rlvr.record.token_exports`)."""

    on = True

    def __init__(self, root: Path, run: str, rank: int = 0, world_size: int = 1):
        self.root, self.run, self.rank, self.world_size = Path(root), run, rank, world_size
        self.step, self.minibatch, self.epoch, self.records, self.row = 0, 0, 0, 0, 0
        self.file: IO[str] | None = None

    def begin(self, step: int) -> None:
        self.close()
        self.step, self.minibatch, self.epoch, self.records = step, 0, -1, 0
        path = records_file(self.root, step, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        marker_file(self.root, step, self.rank).unlink(missing_ok=True)  # a step trained again: not complete
        self.file = path.open("w", encoding="utf-8")

    def at(self, minibatch: int) -> None:
        """The optimizer step about to run: minibatch ``minibatch`` (a new epoch starts at 0)."""
        if minibatch == 0:
            self.epoch += 1
        self.minibatch, self.row = minibatch, 0  # (minibatch, row) names a sequence in every epoch

    def add(self, batch: dict[str, Any], logp: torch.Tensor, entropy: torch.Tensor | None,
            old_logp: torch.Tensor | None) -> None:
        rollouts = batch.get("rollouts")
        if self.file is None or rollouts is None:  # a sharded rank's stand-in pass trains nothing
            return
        logp = logp.detach().float().cpu()
        old = old_logp.detach().float().cpu() if old_logp is not None else None
        sampler = batch["sampler_logp"].detach().float().cpu()
        d = logp - sampler
        mismatch = torch.exp(d) - d - 1.0
        ratio = torch.exp(logp - old) if old is not None else torch.ones_like(logp)
        streams = {k: batch[v].detach().float().cpu() if batch[v] is not None else None
                   for k, v in (("mask", "mask"), ("advantages", "advantages"), ("rl", "rl_weight"),
                                ("ce", "ce_weight"), ("ref_kl", "ref_kl_weight"))}
        for b, r in enumerate(rollouts):
            n = len(r.completion_ids)
            record = {"run": self.run, "step": self.step, "rank": self.rank, "minibatch": self.minibatch,
                      "epoch": self.epoch, "row": self.row, "task_id": r.task_id, "sample_version": r.version,
                      "reward": r.reward, "prompt_ids": list(r.prompt_ids), "completion_ids": list(r.completion_ids),
                      **{k: _row(v, b, n) for k, v in streams.items()},
                      "sampler_logprobs": _row(sampler, b, n), "trainer_logprobs": _row(logp, b, n),
                      "old_logprobs": _row(old, b, n),
                      "entropy": _row(entropy.detach().float().cpu() if entropy is not None else None, b, n),
                      "ratio": _row(ratio, b, n), "mismatch_kl": _row(mismatch, b, n)}
            self.file.write(json.dumps(record) + "\n")
            self.records += 1
            self.row += 1

    def finish(self) -> None:
        """The call's optimizer steps are done: this rank's part of the step is complete."""
        if self.file is None:
            return
        self.close()
        marker_file(self.root, self.step, self.rank).write_text(
            json.dumps({"records": self.records, "world_size": self.world_size}) + "\n")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class _NoExport:
    on = False

    def begin(self, step: int) -> None: ...

    def at(self, minibatch: int) -> None: ...

    def add(self, *args: Any) -> None: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


NO_EXPORT: Any = _NoExport()
