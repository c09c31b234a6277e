"""The documentation: the site builds strictly, its configuration reference lists every key the loader
accepts, and the README stays a first page (short, its notebook example the tested one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.config.reference import config_reference, rows
from rlvr.config.run import WRITE_ONLY_KEYS, RunConfig, section_keys

ROOT = Path(__file__).parents[2]


def python_blocks_marked_tested(page: Path) -> list[str]:
    return re.findall(r"<!-- tested -->\n```python\n(.*?)```", page.read_text(), re.S)


def test_the_site_builds_strictly_with_the_generated_pages(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lora_rank" in (site / "config" / "index.html").read_text()
    assert "Your model, your data, your reward" in (site / "index.html").read_text()


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    nav = set(re.findall(r":\s*([\w/]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    generated = {"index.md", "config.md"}
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert nav - generated == pages, (sorted(nav - generated - pages), sorted(pages - nav))


def test_the_reference_lists_every_key_the_loader_accepts():
    page = config_reference()
    for section, keys in section_keys().items():
        if section == "envs":
            assert "## `[envs.NAME]`" in page
            continue
        model = RunConfig.model_fields[section].annotation
        listed = {key for key, _ in rows(model)} | set(WRITE_ONLY_KEYS.get(section, {}))  # aliases too
        top = {key.split(".")[0] for key in listed}
        assert keys <= top, (section, sorted(keys - top))
        for key in listed:
            assert f"| `{key}` |" in page, (section, key)


def test_a_section_docstring_role_becomes_markdown_code():
    from rlvr.config.reference import markdown_of

    assert markdown_of("see :mod:`rlvr.algos` and :func:`~rlvr.x.find`, ``a = 1``") == \
        "see `rlvr.algos` and `find`, `a = 1`"


def test_the_readme_is_a_first_page_whose_notebook_example_is_the_tested_one():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) < 250
    (example,) = python_blocks_marked_tested(readme)
    assert example == python_blocks_marked_tested(ROOT / "docs" / "notebook.md")[0]  # run by tests/cli/test_notebook.py


def test_every_link_of_the_readme_resolves_in_the_repository():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local and [link for link in local if not (ROOT / link).exists()] == []


def test_the_reference_spells_a_constrained_type_readably():
    reference = config_reference()
    (row,) = [line for line in reference.splitlines() if line.startswith("| `micro_batch` |")]
    assert row.startswith('| `micro_batch` | int >= 1 \\| "auto" |') and "Annotated" not in reference
    assert "NoneType" not in reference and "metadata=" not in reference


def test_every_key_has_a_description_for_the_reference():
    import typing

    from rlvr.config.reference import _model_of

    missing = []
    for section, field in RunConfig.model_fields.items():
        model = _model_of(field.annotation)
        if typing.get_origin(field.annotation) is dict or model is None:
            missing += [] if field.description else [section]
            continue
        missing += [f"{section}.{key}" for key, inner in rows(model) if not inner.description]
    assert not missing, missing
