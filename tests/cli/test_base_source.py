"""A run records what its base is (a GGUF file's hash, a base folder's fingerprint), and a resume, an
export or an eval over a base that changed since is refused naming what changed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rlvr.backends.model import fingerprint as fingerprint_module  # noqa: E402
from rlvr.backends.model import sources  # noqa: E402
from rlvr.backends.model.fingerprint import differences, fingerprint  # noqa: E402
from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.wiring.base_trust import base_source, run_base  # noqa: E402


@pytest.fixture
def gguf(tmp_path, monkeypatch, stand_in_conversion):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"weights, first version")
    return path


def test_the_source_is_described_for_run_json_and_a_changed_file_refused_on_resume(gguf, tmp_path):
    cfg = run_config_from_dict({"model": {"base": str(gguf)}, "task": {"name": "addition"}})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logged = []
    source = base_source(cfg, run_dir, logged.append)
    assert source.sha256 == sources.file_sha256(gguf) and "GGUF" in logged[0]
    (run_dir / "run.json").write_text(json.dumps({"base_source": source.describe()}))
    assert base_source(cfg, run_dir, logged.append) == source  # same file: resumes
    gguf.write_bytes(b"weights, second version")
    with pytest.raises(ConfigError, match="content changed since this run began"):
        base_source(cfg, run_dir, logged.append)


def test_the_tiny_model_and_plain_folders_have_no_hash_to_check(tmp_path):
    assert base_source(run_config_from_dict({}), tmp_path, print) is None
    folder = run_config_from_dict({"model": {"base": str(tmp_path)}})
    assert base_source(folder, tmp_path, print).describe() == {"spec": str(tmp_path), "path": str(tmp_path)}


def test_an_export_or_eval_over_a_changed_gguf_file_is_refused(gguf, tmp_path):
    cfg = run_config_from_dict({"model": {"base": str(gguf)}, "task": {"name": "addition"}})
    run = {"base_source": base_source(cfg, tmp_path, print).describe()}
    assert run_base(tmp_path, cfg, run).name.startswith("model-")  # the cached conversion: unchanged, used
    gguf.write_bytes(b"weights, second version")
    with pytest.raises(ConfigError, match="content changed since this run began"):
        run_base(tmp_path, cfg, run)


# ---- a base folder's fingerprint ----------------------------------------------------------------


def flip(path: Path, at: int = 100, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[at:at + n] = bytes(b ^ 0x5A for b in data[at:at + n])
    path.write_bytes(bytes(data))


@pytest.fixture
def hashed(tmp_path, monkeypatch):
    """Every file the fingerprint hashes, in order (the cache in ``tmp_path/cache``)."""
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []
    real = fingerprint_module.file_sha256
    monkeypatch.setattr(fingerprint_module, "file_sha256", lambda p: calls.append(Path(p).name) or real(p))
    return calls


def weights_folder(root: Path) -> Path:
    root.mkdir()
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 16)
    (root / "config.json").write_text('{"hidden_size": 16}')
    (root / "tokenizer.json").write_text("{}")  # not a weight file: not fingerprinted
    return root


def test_a_second_start_takes_the_hashes_from_the_cache_and_a_changed_file_is_hashed_again(tmp_path, hashed):
    folder = weights_folder(tmp_path / "model")
    first = fingerprint(folder)
    assert sorted(first["files"]) == hashed == ["config.json", "model.safetensors"]
    assert fingerprint(folder) == first and len(hashed) == 2  # the second start reads nothing
    time.sleep(0.02)  # past the kernel's coarse clock, so the write below gets a new ctime
    flip(folder / "model.safetensors")
    now = fingerprint(folder)
    assert hashed[2:] == ["model.safetensors"]
    assert differences(first, now) == [f"model.safetensors changed content (sha256 "
                                       f"{first['files']['model.safetensors']['sha256'][:12]}… then, "
                                       f"{now['files']['model.safetensors']['sha256'][:12]}… now)"]


def test_setting_the_mtime_back_after_a_change_does_not_hide_it(tmp_path, hashed):
    folder = weights_folder(tmp_path / "model")
    first = fingerprint(folder)
    weights = folder / "model.safetensors"
    before = os.stat(weights)
    time.sleep(0.02)
    flip(weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size, same mtime: the ctime moved
    assert os.stat(weights).st_mtime_ns == before.st_mtime_ns
    assert differences(first, fingerprint(folder)) != []


def test_each_difference_names_the_file_and_what_changed(tmp_path, hashed):
    folder = weights_folder(tmp_path / "model")
    first = fingerprint(folder)
    (folder / "model.safetensors").write_bytes(b"short")
    (folder / "config.json").unlink()
    (folder / "extra.bin").write_bytes(b"12345678")
    assert differences(first, fingerprint(folder)) == [
        "config.json was removed", "extra.bin was added (8 bytes)", "model.safetensors is 5 bytes, 4096 then"]


def test_a_cache_that_cannot_be_read_or_written_costs_only_time(tmp_path, hashed, monkeypatch):
    folder = weights_folder(tmp_path / "model")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / fingerprint_module.CACHE_FILE).write_text("{not json")
    first = fingerprint(folder)
    monkeypatch.setenv("RLVR_CACHE", str(folder / "config.json"))  # a file: no cache folder can be made there
    assert fingerprint(folder) == first


# ---- attacks: a run's base folder changed between its start and a resume, an export or an eval ----------


def lora_config(data: str, base: str | None) -> dict:
    model = {"base": base} if base else {"hidden": 16, "layers": 1, "heads": 2}
    return {"loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                     "heldout_frac": 0.25, "lr": 1e-4, "lora_rank": 4},
            "model": {**model, "threads": 1}, "task": {"name": None, "data": data, "env": "exact_match"},
            "sampler": {"max_new_tokens": 2}}


@pytest.fixture(scope="module")
def folder_runs(tmp_path_factory):
    """Two one-step LoRA runs: over a model folder given as ``model.base``, and over the run's own
    ``base/`` (the tiny model built in the run folder)."""
    pytest.importorskip("peft")
    from rlvr.backends.model.tiny import build_tiny_model
    from rlvr.wiring.seams import make_loop

    root = tmp_path_factory.mktemp("base_folder")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLVR_CACHE", str(root / "cache"))
        model = build_tiny_model(root / "model", hidden=16, layers=1, heads=2)
        data = root / "rows.jsonl"
        data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                                for i in range(40)))
        for name, base in (("over_folder", str(model)), ("own_base", None)):
            make_loop(run_config_from_dict(lora_config(str(data), base)), root / name, log=lambda _m: None).run()
        yield root, model


@pytest.mark.train
def test_run_json_records_the_fingerprint_of_the_base_folder(folder_runs):
    root, model = folder_runs
    recorded = json.loads((root / "over_folder" / "run.json").read_text())["base_fingerprint"]
    assert recorded["folder"] == str(model) and sorted(recorded["files"]) == ["config.json", "model.safetensors"]
    assert json.loads((root / "own_base" / "run.json").read_text())["base_fingerprint"]["folder"] == "base"


@pytest.mark.train
@pytest.mark.parametrize("command", ["resume", "export", "eval"])
def test_a_changed_base_folder_is_refused_in_one_line_naming_the_file(folder_runs, command, tmp_path, capsys,
                                                                     monkeypatch):
    """The attack: 64 bytes of the base's weights flipped after the run began. Before, the resume trained
    on over the changed base (rc 0) and the export shipped the adapter over it."""
    from rlvr.cli.commands import main

    root, model = folder_runs
    monkeypatch.setenv("RLVR_CACHE", str(root / "cache"))
    run = root / "over_folder"
    weights = model / "model.safetensors"
    original = weights.read_bytes()
    metrics = (run / "metrics.jsonl").read_bytes()
    flip(weights, at=len(original) // 2)
    try:
        argv = {"resume": ["resume", str(run)], "export": ["export", str(run), "--out", str(tmp_path / "x")],
                "eval": ["eval", str(run), "--n", "1", "--out", str(tmp_path / "x.json")]}[command]
        assert main(argv) == 2
    finally:
        weights.write_bytes(original)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"rlvr: error: model.base={str(model)!r}: the folder changed since this run began "
                            "(model.safetensors changed content (sha256 ")
    assert first.endswith("its checkpoints were trained on the old weights: restore them or start a new run")
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.json").exists()
    assert (run / "metrics.jsonl").read_bytes() == metrics  # nothing trained


@pytest.mark.train
def test_a_file_added_to_the_base_folder_is_refused_and_the_restored_folder_exports(folder_runs, tmp_path,
                                                                                   capsys, monkeypatch):
    from rlvr.cli.commands import main

    root, model = folder_runs
    monkeypatch.setenv("RLVR_CACHE", str(root / "cache"))
    extra = model / "model-extra.safetensors"
    extra.write_bytes(b"\0" * 16)
    try:
        assert main(["export", str(root / "over_folder"), "--out", str(tmp_path / "x")]) == 2
    finally:
        extra.unlink()
    assert "(model-extra.safetensors was added (16 bytes))" in capsys.readouterr().err
    assert main(["export", str(root / "over_folder"), "--out", str(tmp_path / "x")]) == 0


@pytest.mark.train
def test_a_resume_over_the_runs_own_changed_base_is_refused(folder_runs, capsys, monkeypatch):
    from rlvr.cli.commands import main

    root, _ = folder_runs
    monkeypatch.setenv("RLVR_CACHE", str(root / "cache"))
    weights = root / "own_base" / "base" / "model.safetensors"
    original = weights.read_bytes()
    flip(weights, at=len(original) // 2)
    try:
        assert main(["resume", str(root / "own_base")]) == 2
    finally:
        weights.write_bytes(original)
    assert (f"rlvr: error: {root / 'own_base' / 'base'} (the run's own base): the folder changed since this run "
            "began (model.safetensors changed content") in capsys.readouterr().err


@pytest.mark.train
def test_a_resume_takes_the_base_hashes_from_the_cache(folder_runs, monkeypatch):
    """A second start over the same base folder does not read its weights again."""
    from rlvr.wiring.seams import make_loop, saved_config

    root, _ = folder_runs
    monkeypatch.setenv("RLVR_CACHE", str(root / "cache"))
    hashed: list[str] = []
    real = fingerprint_module.file_sha256
    monkeypatch.setattr(fingerprint_module, "file_sha256", lambda p: hashed.append(str(p)) or real(p))
    run = root / "over_folder"
    make_loop(saved_config(run), run, log=lambda _m: None)
    assert hashed == []
