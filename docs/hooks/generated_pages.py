"""mkdocs hooks: pages generated on every build, so the site cannot drift from their sources.

- ``config.md``, the configuration reference, from the run config's models
  (:mod:`rlvr.config.reference`): the site never lists a key the loader would refuse.
- ``index.md``, the home page, from the README (its ``docs/`` links made relative to the site).
"""

from pathlib import Path

from mkdocs.structure.files import File

from rlvr.config.reference import config_reference


def on_files(files, config):
    readme = (Path(config.config_file_path).parent / "README.md").read_text()
    files.append(File.generated(config, "index.md", content=readme.replace("](docs/", "](")))
    files.append(File.generated(config, "config.md", content=config_reference()))
    return files
