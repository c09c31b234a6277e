"""``rlvr rm train --base MODEL --data PAIRS.jsonl --out DIR``: train a reward model from preference
pairs (Bradley-Terry) and export it as a transformers sequence classifier that ``task.rewards =
["rm:DIR"]`` scores with (:mod:`rlvr.backends.train.reward_model`). Prints the held-out ranking
accuracy before and after, and the line to put in a run config. Part of the composition root.
"""

from __future__ import annotations

import argparse
from typing import Any

from rlvr.cli.options import positive


def add_parser(sub: Any) -> None:
    rm = sub.add_parser("rm", help="reward models: rlvr rm train --base MODEL --data PAIRS.jsonl --out DIR")
    rm_sub = rm.add_subparsers(dest="rm_command", required=True)
    t = rm_sub.add_parser("train", help="train a reward model from preference pairs ({prompt?, chosen, rejected} "
                          "per JSONL line) and export it as a sequence classifier for rm:DIR")
    t.add_argument("--base", required=True, help="the model to start from: a folder or a cached hub name (a causal "
                   "LM gets a new score head)")
    t.add_argument("--data", required=True, help="preference pairs, JSONL: {prompt?, chosen, rejected} per line, "
                   "each a string or a list of chat messages")
    t.add_argument("--out", required=True, help="folder to write the classifier, its tokenizer and rm_train.json to")
    t.add_argument("--epochs", type=positive(int), default=1, help="passes over the training pairs (default 1)")
    t.add_argument("--lr", type=positive(float), default=1e-5, help="AdamW learning rate (default 1e-5)")
    t.add_argument("--batch-size", type=positive(int), default=8, help="pairs per step (default 8)")
    t.add_argument("--heldout-frac", type=float, default=0.1, help="pairs held out to measure ranking accuracy "
                   "(default 0.1)")
    t.add_argument("--seed", type=int, default=0, help="seeds the split, the order and the new head (default 0)")
    t.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    t.set_defaults(func=cmd_rm_train)


def cmd_rm_train(args: argparse.Namespace) -> int:
    from rlvr.backends.train.reward_model import read_pairs, train_reward_model

    pairs = read_pairs(args.data)
    report = train_reward_model(args.base, pairs, args.out, epochs=args.epochs, lr=args.lr,
                                batch_size=args.batch_size, heldout_frac=args.heldout_frac, seed=args.seed,
                                device=args.device)
    before, after = report["heldout_before"], report["heldout_after"]
    print(f"rm: {report['train_pairs']} training pairs, {report['steps']} steps; held-out ranking accuracy "
          f"{before['accuracy']:.3f} -> {after['accuracy']:.3f} over {after['pairs']} pairs "
          f"(mean margin {before['mean_margin']:.3f} -> {after['mean_margin']:.3f})")
    print(f"rm: wrote {args.out} (use it as a reward: task.rewards = [\"rm:{args.out}\"])")
    return 0
