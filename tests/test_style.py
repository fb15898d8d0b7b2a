"""The code base stays ruff-clean (the rules are in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    done = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_core_imports_no_flower() -> None:
    """dpadmm/ is pure PyTorch: importing every core module loads no `flwr` module."""
    modules = sorted(p.stem for p in (ROOT / "dpadmm").glob("*.py") if p.stem != "__init__")
    code = ("import sys\n" + "".join(f"import dpadmm.{m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m == 'flwr' or m.startswith('flwr.')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "engine" in modules and "local" in modules
