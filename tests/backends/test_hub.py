"""A hub model is fetched with bounded retries and exponential backoff on transport errors only, through
a fake transport that fails a given number of times (no network here): the waits are 1, 2, 4... s,
capped; an answer from the hub (unknown name, gated, offline mode) is never retried; the last
transport error names what was fetched and how often it was tried. No torch needed."""

from __future__ import annotations

import pytest

from rlvr.backends.model.hub import RetryPolicy, fetch_from_hub, is_transport_error, with_retries
from rlvr.backends.model.sources import resolve_base
from rlvr.errors import HubUnreachableError


class FlakyTransport:
    """Fails ``failures`` times with ``error()``, then answers with a folder; records every call."""

    def __init__(self, failures: int, error=lambda: ConnectionError("connection reset by peer")):
        self.failures, self.error, self.calls = failures, error, []

    def __call__(self, name: str, ignore: list[str]) -> str:
        self.calls.append((name, list(ignore)))
        if len(self.calls) <= self.failures:
            raise self.error()
        return f"/cache/{name}"


class Response:
    def __init__(self, status_code: int):
        self.status_code = status_code


class HTTPStatusError(Exception):
    """Like the hub client's HTTP errors: the response rides on the exception."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.response = Response(status)


class RepositoryNotFoundError(HTTPStatusError):
    pass


class ConnectError(Exception):
    """Named like httpx's: recognised by its class name."""


def fetch(transport, policy=RetryPolicy(retries=4, backoff_s=1.0, max_backoff_s=3.0), files=("model.safetensors",)):
    waits, said = [], []
    folder = fetch_from_hub("org/model", download=transport, list_files=lambda _n: list(files), policy=policy,
                            sleep=waits.append, log=said.append)
    return folder, waits, said


def test_a_transport_failing_three_times_is_retried_with_exponential_backoff_capped():
    transport = FlakyTransport(3)
    folder, waits, said = fetch(transport)
    assert folder == "/cache/org/model" and len(transport.calls) == 4
    assert waits == [1.0, 2.0, 3.0]  # 1, 2, then 4 capped at max_backoff_s = 3
    assert said[0] == "hub: downloading org/model: ConnectionError: connection reset by peer; retry 1 of 4 in 1s"
    assert "*.bin" in transport.calls[0][1] and "*.gguf" in transport.calls[0][1]  # safetensors: no pickles


def test_retries_are_bounded_and_the_last_error_names_what_and_how_often():
    transport = FlakyTransport(10)
    with pytest.raises(HubUnreachableError) as err:
        fetch(transport, RetryPolicy(retries=2, backoff_s=0.5))
    assert len(transport.calls) == 3 and err.value.attempts == 3
    assert str(err.value) == ("downloading org/model: the hub could not be reached after 3 attempt(s); "
                              "last: ConnectionError: connection reset by peer")
    assert isinstance(err.value.__cause__, ConnectionError)


@pytest.mark.parametrize("error", [lambda: RepositoryNotFoundError(404), lambda: HTTPStatusError(401),
                                   lambda: HTTPStatusError(403), lambda: ValueError("bad revision"),
                                   lambda: OSError(28, "No space left on device")],
                         ids=["unknown-name", "401", "403", "value-error", "disk-full"])
def test_an_answer_from_the_hub_or_a_local_failure_is_never_retried(error):
    transport = FlakyTransport(1, error)
    with pytest.raises(type(error())):
        fetch(transport)
    assert len(transport.calls) == 1


@pytest.mark.parametrize("error", [lambda: HTTPStatusError(503), lambda: HTTPStatusError(429),
                                   lambda: ConnectError("refused"), lambda: TimeoutError("read timed out")],
                         ids=["503", "429", "connect-error", "timeout"])
def test_transport_errors_and_hub_downtime_are_retried(error):
    transport = FlakyTransport(2, error)
    folder, waits, _ = fetch(transport)
    assert folder == "/cache/org/model" and waits == [1.0, 2.0]


def test_a_connection_error_wrapped_in_a_not_in_cache_error_is_transport_but_offline_mode_is_not():
    class LocalEntryNotFoundError(FileNotFoundError):
        pass

    class OfflineModeIsEnabled(ConnectionError):
        pass

    try:
        try:
            raise ConnectError("no route to host")
        except ConnectError as exc:
            raise LocalEntryNotFoundError("cannot find the files in the local cache") from exc
    except LocalEntryNotFoundError as wrapped:
        assert is_transport_error(wrapped)
    try:
        try:
            raise OfflineModeIsEnabled("HF_HUB_OFFLINE is set")
        except OfflineModeIsEnabled as exc:
            raise LocalEntryNotFoundError("cannot find the files in the local cache") from exc
    except LocalEntryNotFoundError as wrapped:
        assert not is_transport_error(wrapped)


def test_pickled_weights_are_fetched_only_without_safetensors_and_the_listing_is_retried_too():
    listing = FlakyTransport(1)
    waits: list[float] = []
    transport = FlakyTransport(0)
    fetch_from_hub("org/model", download=transport, list_files=lambda n: listing(n, []) and ["pytorch_model.bin"],
                   policy=RetryPolicy(retries=1, backoff_s=0.25), sleep=waits.append, log=lambda _m: None)
    assert len(listing.calls) == 2 and waits == [0.25]
    assert "*.bin" not in transport.calls[0][1]


def test_the_policy_reads_its_environment(monkeypatch):
    monkeypatch.setenv("RLVR_HUB_RETRIES", "1")
    monkeypatch.setenv("RLVR_HUB_BACKOFF_S", "0")
    calls = []
    with pytest.raises(HubUnreachableError, match="after 2 attempt"):
        with_retries(lambda: calls.append(1) or (_ for _ in ()).throw(ConnectionError("down")), "x",
                     log=lambda _m: None)
    assert len(calls) == 2


def test_the_policy_has_its_defaults_where_the_environment_is_silent(monkeypatch):
    monkeypatch.delenv("RLVR_HUB_RETRIES", raising=False)
    monkeypatch.delenv("RLVR_HUB_BACKOFF_S", raising=False)
    assert RetryPolicy.from_env() == RetryPolicy()
    monkeypatch.setenv("RLVR_HUB_RETRIES", "2")
    assert RetryPolicy.from_env() == RetryPolicy(retries=2)


def test_resolve_base_fetches_a_hub_name_and_passes_folders_through(tmp_path):
    transport = FlakyTransport(2)
    fetched = resolve_base("org/model", fetch=lambda name: fetch_from_hub(
        name, download=transport, list_files=None, policy=RetryPolicy(backoff_s=0), sleep=lambda _s: None,
        log=lambda _m: None))
    assert fetched.spec == "org/model" and fetched.path == "/cache/org/model" and len(transport.calls) == 3
    (tmp_path / "org").mkdir()
    folder = str(tmp_path / "org")
    assert resolve_base(folder, fetch=pytest.fail).path == folder
    assert resolve_base("runs/x/base", fetch=pytest.fail).path == "runs/x/base"  # a path, not a hub name
