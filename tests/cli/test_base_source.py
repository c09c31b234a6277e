"""A run on a GGUF base records the file's hash, and a resume on a changed file is refused."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from rlvr.backends.model import sources  # noqa: E402
from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.wiring.seams import base_source  # noqa: E402


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
