"""Without the train extra, the CLI and the backend gate say which extra to install."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TORCH = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in {'torch', 'transformers', 'peft'}:\n"
    "            raise ImportError('blocked: ' + name)\n"
    "sys.meta_path.insert(0, Block())\n"
)


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True, text=True, timeout=60)


def test_missing_train_extra_is_named():
    proc = run_python(
        "from rlvr.backends import require_train_extra\n"
        "from rlvr.errors import MissingExtraError\n"
        "try:\n    require_train_extra()\nexcept MissingExtraError as e:\n    print('MISSING', e)\n"
    )
    assert "MISSING" in proc.stdout and "rlvr[train]" in proc.stdout, proc.stdout + proc.stderr


def test_cli_train_without_torch_fails_cleanly(tmp_path):
    proc = run_python(
        "import sys\nfrom rlvr.cli.commands import main\n"
        f"sys.exit(main(['train', '--out', {str(tmp_path / 'run')!r}]))\n"
    )
    assert proc.returncode == 2, proc.stderr
    assert "rlvr[train]" in proc.stderr and "Traceback" not in proc.stderr
