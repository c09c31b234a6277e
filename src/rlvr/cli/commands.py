"""The ``rlvr`` command: train, resume, export, report, eval, serve, proxy, queue, autonomy, runs, split,
rollout-worker.

Argument parsing and one function per subcommand; the run's backends are picked in
:mod:`rlvr.wiring`. Backend modules are imported lazily so ``rlvr --help`` works without torch, and a
missing extra is reported by name.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from rlvr.cli.options import add_origin_argument, add_render_arguments, port_number, positive, render_limits
from rlvr.errors import AbortedError, MissingExtraError, RecordWarning, RLVRError, UsageError
from rlvr.wiring.cpu_waits import threads_sleep_when_idle


def _progress_printer() -> Any:
    """One plain line per step (see :mod:`rlvr.cli.progress` for the live display)."""
    from rlvr.cli.progress import PlainProgress

    return PlainProgress()


def summary_lines(summary: dict[str, Any], run_dir: Path) -> list[str]:
    """The end of ``rlvr train`` (and ``rlvr.train``): where the record is, the selection and its gain
    (in points only for rewards in [0, 1]), the like-for-like train-vs-held-out gap, the pool score."""
    from rlvr.record.gain import change_text, in_unit_interval

    base, sel = summary["baseline_heldout_score"], summary["selected_heldout_score"]
    unit = summary.get("rewards_in_unit_interval", in_unit_interval([base, sel]))
    lines = [f"run record: {run_dir}",
             f"held-out at step 0: {base:.3f}   selected: step {summary['selected_step']} "
             f"with held-out {sel:.3f} ({change_text(base, sel, unit)})"]
    gaps = summary.get("pool_heldout_gap") or {}
    if gaps:
        last = max(gaps, key=int)
        lines.append(f"gap at step {last}, training rows minus held-out: {gaps[last]:+.3f} "
                     f"({summary.get('gap_basis', 'pool score')})")
    pool = summary["final_pool_score"]
    lines.append(f"final pool score (mean reward of training samples): {'-' if pool is None else f'{pool:.3f}'}   "
                 f"stop: {summary['stop_cause']}")
    return lines


def _print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    print()
    for line in summary_lines(summary, run_dir):
        print(line)


def cmd_train(args: argparse.Namespace) -> int:
    from rlvr.backends import require_train_extra
    from rlvr.config.run import load_run_config

    cfg = load_run_config(args.config, args.overrides)
    require_train_extra()
    from rlvr.record.run_folder import check_fresh_run_dir
    from rlvr.wiring.scale import ranks, ray_ranks

    out = Path(args.out) if args.out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    args.out = str(out)  # where a failed run can be resumed from
    on_ray = args.nproc is not None and cfg.cluster.backend == "ray"  # ranks 1..N-1 as Ray actors, not torchrun
    if args.nproc is not None:
        check_fresh_run_dir(out)
        if not on_ray:
            return _ranks_exit(ranks.launch(args.nproc, ["train", *([args.config] if args.config else []), "--out",
                                                         str(out), *args.overrides]), out)
    group = ray_ranks.join(cfg, args.nproc) if on_ray else ranks.join(cfg)
    if group is not None and group.rank != 0:
        ranks.serve_then_exit(cfg, out)
    return _finished(train_fresh(cfg, out, group), out)


def train_fresh(cfg: Any, out: Path, group: Any = None, log: Any = print) -> Any:
    """What ``rlvr train`` does in the process that runs the loop, once the config is read (``rlvr.train``
    runs exactly this): ``out`` checked and claimed (an unfinished start in it cleared), the loop built
    and run; a start that fails before run.json leaves nothing behind (:mod:`rlvr.record.run_folder`).
    Returns the loop, which holds the record and the summary."""
    from rlvr.cli.progress import progress_display
    from rlvr.record.run_folder import check_fresh_run_dir, clear_unfinished_start, first_start
    from rlvr.wiring.scale import ranks
    from rlvr.wiring.seams import make_loop

    check_fresh_run_dir(out)
    clear_unfinished_start(out, log)
    display = progress_display(cfg.log.progress)
    loop = None
    try:
        with first_start(out):
            loop = make_loop(cfg, out, progress_cb=display, log=log)
            loop.run()
    finally:
        display.close()
        if group is not None:
            ranks.leave(loop)
    return loop


# A run stopped on request (the memory watchdog, should_abort): resumable, not failed.
EXIT_STOPPED = 75


def _ranks_exit(code: int, run_dir: Path) -> int:
    """torchrun's exit status, except that a run rank 0 stopped on request (its record ends aborted) keeps
    its own: torchrun reports any non-zero rank exit as 1."""
    if code == 0:
        return 0
    from rlvr.record.run_record import read_record

    try:
        finished = read_record(run_dir).finished
    except (RLVRError, OSError):
        return code
    return EXIT_STOPPED if finished is not None and finished.data.get("stop_cause") == "aborted" else code


def _finished(loop: Any, run_dir: Path) -> int:
    """The summary of a run that reached its end, or why it stopped early and how to continue it."""
    if loop.abort_reason is not None:
        print(f"rlvr: stopped at step {loop.step}: {loop.abort_reason}", file=sys.stderr)
        print(f"rlvr: the run is checkpointed at step {loop.step}: `rlvr resume {run_dir}` continues it "
              "(with --watchdog.KEY=VALUE to change the watchdog's levels)", file=sys.stderr)
        return EXIT_STOPPED
    _print_summary(loop.summary(), run_dir)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from rlvr.backends import require_train_extra

    require_train_extra()
    from rlvr.cli.progress import progress_display
    from rlvr.config.run import apply_overrides, run_config_from_dict
    from rlvr.wiring.scale import ranks, ray_ranks
    from rlvr.wiring.seams import make_loop, saved_config

    run_dir = Path(args.run_dir)
    cfg = saved_config(run_dir)
    on_ray = args.nproc is not None and cfg.cluster.backend == "ray"  # ranks 1..N-1 as Ray actors, not torchrun
    if args.nproc is not None and not on_ray:
        return _ranks_exit(ranks.launch(args.nproc, ["resume", str(run_dir), *args.overrides]), run_dir)
    group = ray_ranks.join(cfg, args.nproc) if on_ray else ranks.join(cfg)
    if group is not None and group.rank != 0:
        ranks.serve_then_exit(cfg, run_dir)
    if args.overrides:
        other = [o for o in args.overrides if not o.removeprefix("--").startswith("watchdog.")]
        if other:
            raise UsageError(f"rlvr resume: only the watchdog's keys may change on resume (--watchdog.KEY=VALUE); "
                             f"not {other[0]!r}")
        origins: dict[str, str] = {}
        cfg = run_config_from_dict(apply_overrides(cfg.model_dump(mode="json"), args.overrides, origins),
                                   str(run_dir), origins)
    display = progress_display(cfg.log.progress)
    loop = None
    try:
        loop = make_loop(cfg, run_dir, progress_cb=display)
        loop.run(resume=True)
    finally:
        display.close()
        if group is not None:
            ranks.leave(loop)
    return _finished(loop, run_dir)


def cmd_export(args: argparse.Namespace) -> int:
    from rlvr.backends import require_train_extra

    require_train_extra()
    from rlvr.cli.export import export

    run_dir = Path(args.run_dir)
    written = export(run_dir, Path(args.out) if args.out else run_dir / "export", args.step, gguf=args.gguf)
    print(json.dumps(written, indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from rlvr.errors import require_extra
    from rlvr.record.run_record import read_record

    record = read_record(args.run_dir)
    finished = record.finished
    summary = {"selected": record.selected, "heldout_scores": record.heldout_scores,
               "finished": finished.data.get("stop_cause") if finished else None}
    try:
        require_extra("report", "matplotlib")
    except MissingExtraError as exc:  # the selection still prints; only the page needs the plots
        print(json.dumps({**summary, "page": None}, indent=2))
        print(f"rlvr report: no page written: {exc}", file=sys.stderr)
        return 0
    from rlvr.record.report import write_report

    written = write_report(args.run_dir)
    print(json.dumps({**summary, "page": written["page"], "omitted": written["omitted"]}, indent=2))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from rlvr.backends import require_train_extra

    require_train_extra()
    from rlvr.cli.evaluate import evaluate, write_eval

    run_dir = Path(args.run_dir)
    report = evaluate(run_dir, step=args.step, data=args.data, env=args.env, n=args.n,
                      temperature=args.temperature, threshold=args.pass_threshold)
    out = Path(args.out) if args.out else run_dir / "eval" / f"step_{report['step']}.json"
    write_eval(report, out)
    seen = report.get("overlap", {})
    if seen.get("in_train") or seen.get("in_heldout") or seen.get("in_trained_on"):
        print(f"rlvr eval: of the {seen['n']} rows of {args.data}, {seen['in_train']} are training rows of this run "
              f"and {seen['in_heldout']} its held-out rows ({seen['in_trained_on']} were trained on, the base's "
              "rows included); the score counts them as given", file=sys.stderr)
    print(json.dumps({k: v for k, v in report.items() if k != "per_task"} | {"report": str(out)}, indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from rlvr.backends import require_train_extra
    from rlvr.backends.model.sources import is_gguf, resolve_base  # torch only once a conversion runs
    from rlvr.errors import require_extra

    local = Path(args.model_dir).expanduser()
    hub_name = re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", args.model_dir) is not None
    if is_gguf(args.model_dir):
        require_train_extra()
        args.model_dir = resolve_base(args.model_dir).path  # converted once, into the cache
        local, hub_name = Path(args.model_dir), False
    elif local.is_dir():  # a tokenizer config listing extra_special_tokens loads through its shadow
        args.model_dir = resolve_base(args.model_dir).path
        local = Path(args.model_dir)
    elif not local.exists() and not hub_name:
        raise UsageError(f"rlvr serve: {args.model_dir} is not a folder (and not a hub name like org/model)")
    if local.exists() and not local.is_dir():
        raise UsageError(f"rlvr serve: {args.model_dir} is a file; give the model folder")
    require_train_extra()
    require_extra("serve", "fastapi", "uvicorn")
    from rlvr.backends.serve.app import serve
    from rlvr.backends.serve.model_host import ServerPolicy

    policy = ServerPolicy(api_key=serve_api_key(args), allowed_dirs=tuple(os.path.abspath(d) for d in args.allowed_dir),
                          max_body_bytes=int(args.max_body_mb * 2**20), max_samples=args.max_samples,
                          max_in_flight=args.max_in_flight, body_timeout_s=args.body_timeout_s,
                          render=render_limits(args, "rlvr serve"), allowed_origins=tuple(args.allowed_origin))
    return serve(args.model_dir, adapter=args.adapter, host=args.host, port=args.port, device=args.device,
                 dtype=args.dtype, served_version=args.served_version, served_model_name=args.served_model_name,
                 parent_pid=args.parent_pid, threads=args.threads, log_level=args.log_level, policy=policy)


def serve_api_key(args: argparse.Namespace) -> str | None:
    """The key from ``--api-key-file``, ``$RLVR_API_KEY`` or ``--api-key`` (warned about: any user
    of the machine reads a command line in ``ps``)."""
    given = [name for name, value in (("--api-key", args.api_key), ("--api-key-file", args.api_key_file))
             if value is not None]
    if len(given) > 1:
        raise UsageError("rlvr serve: give --api-key or --api-key-file, not both")
    if args.api_key_file is not None:
        try:
            return Path(args.api_key_file).expanduser().read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"rlvr serve --api-key-file {args.api_key_file}: cannot read it ({exc})") from None
    if args.api_key is not None:
        print("rlvr serve: warning: a key given by --api-key shows in `ps` to every user of this machine; "
              "set RLVR_API_KEY or use --api-key-file instead", file=sys.stderr)
        return args.api_key
    return os.environ.get("RLVR_API_KEY") or None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlvr", description="RL with verifiable rewards, held-out honest.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run a config: rlvr train CONFIG.toml [--section.key=value ...]")
    t.add_argument("config", nargs="?", help="TOML run config (defaults when omitted)")
    t.add_argument("--out", help="run folder (default runs/<timestamp>)")
    t.add_argument("--nproc", type=int, help="train on N data-parallel ranks (runs torchrun for you)")
    t.set_defaults(func=cmd_train)
    r = sub.add_parser("resume", help="continue a run folder from its last checkpoint "
                       "[--watchdog.KEY=VALUE ...]")
    r.add_argument("run_dir")
    r.add_argument("--nproc", type=int, help="continue on N data-parallel ranks (any N: checkpoints do not "
                   "depend on it)")
    r.set_defaults(func=cmd_resume)
    e = sub.add_parser("export", help="write the selected checkpoint as an adapter and a merged model")
    e.add_argument("run_dir")
    e.add_argument("--out", help="output folder (default RUN_DIR/export)")
    e.add_argument("--step", type=int, help="export this step instead of the selected one")
    e.add_argument("--gguf", action="store_true", help="also write the merged model back as a GGUF file, shaped and "
                   "quantised as the base's (a run over a GGUF base only)")
    e.set_defaults(func=cmd_export)
    rep = sub.add_parser("report", help="write RUN_DIR/report/index.html (plots, summary) and print the selection")
    rep.add_argument("run_dir")
    rep.set_defaults(func=cmd_report)
    ev = sub.add_parser("eval", help="score a checkpoint with pass@k on held-out or any dataset, into JSON")
    ev.add_argument("run_dir")
    ev.add_argument("--step", type=int, help="checkpoint to score (default: the selected one)")
    ev.add_argument("--data", help="a task.data spec to score instead of the run's held-out split")
    ev.add_argument("--env", help="in a run of several environments: whose reward scores --data")
    ev.add_argument("--n", type=int, default=4, help="episodes per task (default 4)")
    ev.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 is greedy (default 1)")
    ev.add_argument("--pass-threshold", type=float, default=1.0, help="reward at which a sample passes (default 1)")
    ev.add_argument("--out", help="JSON report (default RUN_DIR/eval/step_N.json)")
    ev.set_defaults(func=cmd_eval)
    s = sub.add_parser("serve", help="serve a model folder over an OpenAI-compatible HTTP API (vLLM's shapes)")
    s.add_argument("model_dir", help="model folder, hub name, or GGUF file (file.gguf, gguf:package/path.gguf)")
    s.add_argument("--adapter", help="PEFT adapter folder applied to the served model")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; beyond it needs --api-key)")
    s.add_argument("--api-key", help="clients must send Authorization: Bearer KEY; shows in `ps`, so prefer "
                   "$RLVR_API_KEY or --api-key-file (default: $RLVR_API_KEY)")
    s.add_argument("--api-key-file", metavar="FILE", help="read the API key from FILE (its first line)")
    s.add_argument("--allowed-dir", action="append", default=[], metavar="DIR",
                   help="a folder adapters and weights may be loaded from (repeatable; default none)")
    s.add_argument("--max-body-mb", type=positive(float), default=8.0, help="largest request body (default 8)")
    s.add_argument("--body-timeout-s", type=positive(float), default=30.0,
                   help="a request body must arrive whole within this; else 408 (default 30)")
    s.add_argument("--max-samples", type=positive(int), default=256, help="prompts x n per request (default 256)")
    s.add_argument("--max-in-flight", type=positive(int), default=64,
                   help="requests at once, counted once their body is read; beyond, 429 (default 64)")
    add_render_arguments(s)
    add_origin_argument(s)
    s.add_argument("--port", type=port_number, default=8000, help="TCP port, 1-65535 (default 8000)")
    s.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    s.add_argument("--served-version", type=int, help="policy version of the served weights "
                   "(default: rlvr_version.json in the adapter or model folder, else 0)")
    s.add_argument("--served-model-name", help="the name requests use (default MODEL_DIR as given)")
    s.add_argument("--parent-pid", type=int, help="exit when this process is gone (set by rlvr's launcher)")
    s.add_argument("--threads", type=int, help="torch CPU threads")
    s.add_argument("--log-level", default="warning")
    s.set_defaults(func=cmd_serve)
    from rlvr.cli.autonomy import add_parser as add_autonomy_parser
    from rlvr.cli.proxy import add_parser as add_proxy_parser
    from rlvr.cli.queue import add_parser as add_queue_parser
    from rlvr.cli.reward_model import add_parser as add_rm_parser
    from rlvr.cli.rollout_worker import add_parser as add_rollout_worker_parser
    from rlvr.cli.split import add_parser as add_split_parser
    from rlvr.wiring.runs import add_parser as add_runs_parser

    add_proxy_parser(sub)
    add_queue_parser(sub)
    add_autonomy_parser(sub)
    add_rm_parser(sub)
    add_split_parser(sub)
    add_runs_parser(sub)
    add_rollout_worker_parser(sub)
    return p


# A write the disk refused (full, over quota, read-only, failing): said in one line wherever it happens.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None, *, shown: Any = warnings.showwarning) -> None:
    """rlvr's own warnings (a run folder repaired to resume) as one ``rlvr: warning:`` line."""
    if issubclass(category, RecordWarning):
        print(f"rlvr: warning: {message}", file=sys.stderr)
    else:
        shown(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> int:
    threads_sleep_when_idle()  # before torch loads (cpu_waits.py: spinning threads crawl on a shared machine)
    args, rest = parser().parse_known_args(argv)
    if args.command in ("train", "resume", "split") or (args.command == "queue" and args.queue_command == "add"):
        args.overrides = rest
    elif rest:
        parser().error(f"unrecognised arguments: {' '.join(rest)}")
    warnings.showwarning = _show_warning
    try:
        return args.func(args)
    except AbortedError as exc:
        print(f"rlvr: stopped: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("rlvr: interrupted (Ctrl-C) before the run started recording; nothing to resume", file=sys.stderr)
        return 130
    except RLVRError as exc:
        print(f"rlvr: error: {exc}", file=sys.stderr)
        hint = _resume_hint(args)
        if hint:
            print(hint, file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        print(f"rlvr: error: writing {exc.filename or 'a file'} failed: {exc.strerror or exc}", file=sys.stderr)
        hint = _resume_hint(args)
        if hint:
            print(hint, file=sys.stderr)
        return 2


def _resume_hint(args: argparse.Namespace) -> str | None:
    """After a run failed mid-way (a server died, a disk filled): where `rlvr resume` picks it up."""
    if args.command not in ("train", "resume"):
        return None
    from rlvr.record.run_record import complete_checkpoints

    folder = args.out if args.command == "train" else args.run_dir
    if not folder:
        return None
    run_dir = Path(folder)
    done = [p.name for p in complete_checkpoints(run_dir)]
    if not done and (run_dir / "events.jsonl").exists():
        return (f"rlvr: nothing was checkpointed, so there is nothing to resume; the same `rlvr train` command "
                f"starts again in {run_dir} (the full traceback is in {run_dir / 'events.jsonl'})")
    if not done or not (run_dir / "run.json").exists():
        return None
    return f"rlvr: the run keeps its last checkpoint ({done[-1]}): `rlvr resume {run_dir}` continues it once the " \
           "cause is fixed"


if __name__ == "__main__":
    sys.exit(main())
