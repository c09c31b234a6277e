"""One error tree for rlvr; every error rlvr raises on purpose is in it::

    RLVRError
    ├── ConfigError        (ValueError)    a configuration value is invalid; names the field
    ├── DataError          (ValueError)    a row of input data is malformed; names source, row, field
    ├── RecordError        (ValueError)    a run folder is missing, incomplete or inconsistent
    ├── UsageError         (ValueError)    a command line that cannot be carried out as given
    ├── RecordWarning      (UserWarning)   a warning: a run folder was repaired to resume
    ├── MissingExtraError  (ImportError)   an optional package is missing; names the extra
    ├── RLLoopError        (RuntimeError)  the loop refused a run or could not continue
    │   └── AbortedError                   stopped on purpose (Ctrl-C, sys.exit in user code); resumable
    ├── EnvError           (RuntimeError)  an environment, its reward or a service it calls failed
    │   ├── RewardError    (ValueError)    a reward raised or returned something that is not a reward
    │   ├── CalculatorError (ValueError)   an expression the calculator tool refuses
    │   ├── SearchError                    the search service failed or was asked wrongly
    │   └── GradingTimeout (TimeoutError)  a grader ran out of time
    └── BackendError       (RuntimeError)  a model, trainer, sampler, server or weight-sync lane failed
        ├── TransientError                 one attempt failed, worth another (transport, timeout, 5xx)
        ├── ActorTimeout   (TimeoutError)  a cluster actor did not answer a call within its bound
        ├── ActorLost                      a cluster actor is gone for good (killed, restarts spent)
        └── RequestError   (ValueError)    a request ``rlvr serve`` refuses (carries the HTTP status)
            └── ClientGone                 the client left before its answer; its work was cancelled (499)

Every class also subclasses the stdlib error it stands in for, so callers that catch
``ValueError`` or ``RuntimeError`` keep working. Messages name the field, row or request at
fault and say what to do. :func:`safe_repr` and :func:`exception_text` are how messages quote a
user's value or exception (bounded, never raising); :func:`user_frame` is where in the user's code
an exception was raised. Standard library only.
"""

from __future__ import annotations

import os
import sysconfig
import traceback

_REPR_LIMIT = 200


class RLVRError(Exception):
    """Base class of every error rlvr raises on purpose."""


class ConfigError(RLVRError, ValueError):
    """A configuration value is invalid; the message names the field."""


class DataError(RLVRError, ValueError):
    """A row of input data is malformed; the message names the source, row and field."""


class RecordError(RLVRError, ValueError):
    """A run record on disk is missing, incomplete or inconsistent."""


class UsageError(RLVRError, ValueError):
    """A command line that cannot be carried out as given."""


class RecordWarning(RLVRError, UserWarning):
    """A run folder was repaired to resume: a damaged checkpoint set aside, a record file rebuilt from a
    checkpoint's copy. The message says what and why; the record keeps it as a warning event."""


class MissingExtraError(RLVRError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class RLLoopError(RLVRError, RuntimeError):
    """The loop refused a run or could not continue (corpus too small, missing seam, a sample it
    will not train on, a resume that does not match)."""


class AbortedError(RLLoopError):
    """The run was stopped on purpose: Ctrl-C, or ``sys.exit`` / ``KeyboardInterrupt`` raised by user
    code (a reward, an environment, a rollout function). The record says so (an ``aborted`` event)
    and ``rlvr resume`` continues from its last checkpoint."""


def aborted_by(exc: BaseException, where: str) -> AbortedError:
    """The :class:`AbortedError` for a ``SystemExit`` or ``KeyboardInterrupt`` raised by user code."""
    what = f"SystemExit({exc.code!r})" if isinstance(exc, SystemExit) else type(exc).__name__
    error = AbortedError(f"{where}: user code raised {what}; the run stopped and `rlvr resume` continues it")
    error.__cause__ = exc
    return error


def stop_error(exc: BaseException, step: int) -> AbortedError:
    """What a run stopped at ``step`` by ``exc`` raises: an :class:`AbortedError` as is, Ctrl-C said
    as such, user code's ``SystemExit`` as :func:`aborted_by` says it."""
    if isinstance(exc, AbortedError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        error = AbortedError(f"interrupted at step {step} (Ctrl-C); `rlvr resume` continues the run")
        error.__cause__ = exc
        return error
    return aborted_by(exc, f"step {step}")


class EnvError(RLVRError, RuntimeError):
    """An environment, its reward function or a service it calls failed."""


class AgentError(EnvError):
    """An agent episode that cannot become a training sample: the agent made no model call through its
    base URL, or returned something that is not a result (see :mod:`rlvr.rollouts.agents`)."""


class RewardError(EnvError, ValueError):
    """A reward function raised or returned something that is not a reward; the message names the
    environment and the offending value or exception. The loop decides whether to fail or drop."""


class CalculatorError(EnvError, ValueError):
    """An expression the calculator refuses: unsupported syntax, a bad number, a result too large."""


class SearchError(EnvError):
    """The search service could not be built, reached or answered."""


class EditRefused(EnvError, ValueError):
    """A coding agent's reply the environment will not apply; the message says which line and why."""


class GradingTimeout(EnvError, TimeoutError):
    """A grader (math-verify in its worker) did not finish within its time limit."""


class BackendError(RLVRError, RuntimeError):
    """A backend failed: the trainer, a generator, an inference server or a weight-sync lane."""


class GenerationAbandoned(BackendError):
    """A batch given up mid-way: every caller stopped waiting for it, or its engine is closing."""


class ServersLostError(AbortedError, BackendError):
    """Every inference server of the sampler pool left the rotation; the message names each and why.
    The run stops as an abort does (recorded, checkpointed) and ``rlvr resume`` continues it."""


class TransientError(BackendError):
    """One attempt at a request failed in a way worth another try (transport error, timeout, 5xx);
    the HTTP generator retries these and reports a :class:`BackendError` once retries are spent."""


class ActorTimeout(BackendError, TimeoutError):
    """A cluster actor (a reward worker on Ray) did not answer a call within its bound."""


class ActorLost(BackendError):
    """A cluster actor is gone for good (killed without restart, its restarts spent, its node lost);
    the message names it and why."""


class HubUnreachableError(BackendError, ConnectionError):
    """The model hub could not be reached within the bounded retries (:mod:`rlvr.backends.model.hub`);
    ``attempts`` says how many were made."""

    def __init__(self, message: str, attempts: int = 1):
        super().__init__(message)
        self.attempts = attempts


class WorkersLostError(AbortedError, BackendError):
    """Every remote rollout worker left (:mod:`rlvr.rollouts.remote`); the message names each and why.
    The run stops as an abort does (recorded, checkpointed) and ``rlvr resume`` continues it."""


class WorkerLost(BackendError):
    """A remote rollout worker stopped answering: its process died, its connection dropped, or it
    overran its bound. The row it held is sent to another worker (:mod:`rlvr.rollouts.remote`)."""


class RemoteRolloutError(RLVRError, RuntimeError):
    """A rollout function raised on a remote worker, with an exception type this process does not have;
    its class is named like the original, so the record reads as a local run's would."""


class RequestError(BackendError, ValueError):
    """A request ``rlvr serve`` refuses: ``param`` names the field at fault, ``status`` is the HTTP
    status it answers with (vLLM's error shape is built from these by the server)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


class UnknownSetupError(RequestError):
    """A row named a setup a rollout worker does not hold (it restarted since): the client sends the setup
    again, then the row."""

    def __init__(self, setup_id: str):
        super().__init__(f"this rollout worker holds no setup {setup_id!r} (it may have restarted): send it again",
                         "setup", 404)
        self.setup_id = setup_id


CLIENT_CLOSED = 499  # nginx's status for a request whose client left before the answer


class ClientGone(RequestError):
    """The client disconnected before its answer was ready; its work was cancelled."""

    def __init__(self) -> None:
        super().__init__("the client disconnected before its answer was ready; its generation was stopped",
                         None, CLIENT_CLOSED)


def require_extra(extra: str, *modules: str) -> None:
    """Import ``modules`` or raise :class:`MissingExtraError` naming ``rlvr[extra]``."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            hint = " (install torch first to pick the CPU or CUDA build you want)" if extra == "train" else ""
            raise MissingExtraError(f"this needs the '{name}' package: pip install 'rlvr[{extra}]'{hint}") from exc


def safe_repr(value: object, limit: int = _REPR_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters; never raises."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any failure becomes a named error
        text = f"<{type(value).__name__} object whose repr() raised>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exception_text(exc: BaseException) -> str:
    """``"Type: message"`` of an exception, cut to a readable length; never raises."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - any failure becomes a named error
        message = "<str() of the exception raised>"
    if len(message) > 2 * _REPR_LIMIT:
        message = message[: 2 * _REPR_LIMIT - 3] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def exception_at(exc: BaseException) -> str:
    """:func:`exception_text` with where the user's code raised it, ``"ValueError: bad (at rewards.py:12 in
    score)"``: what a message quotes for an exception of user code (a reward, an environment)."""
    at = user_frame(exc)
    return exception_text(exc) + (f" (at {at})" if at else "")


_RLVR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_frame(exc: BaseException) -> str | None:
    """``"file.py:LINE in fn"``: where ``exc`` was raised in the user's code (the innermost frame that is
    neither rlvr's nor an installed library's; else the innermost that is not rlvr's); ``None`` when every
    frame is rlvr's. A path under the working folder is shown relative to it."""
    try:
        frames = traceback.extract_tb(exc.__traceback__)
        libraries = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                           for k in ("stdlib", "platstdlib", "purelib", "platlib")})
        outside = [f for f in frames if not os.path.abspath(f.filename).startswith(_RLVR_DIR)]
        own = [f for f in outside if not os.path.abspath(f.filename).startswith(libraries)]
        if not outside:
            return None
        frame = (own or outside)[-1]
        path = os.path.abspath(frame.filename)
        cwd = os.getcwd() + os.sep
        return f"{path.removeprefix(cwd) if path.startswith(cwd) else frame.filename}:{frame.lineno} in {frame.name}"
    except Exception:  # noqa: BLE001 - a location is a courtesy: never fail the message for it
        return None
