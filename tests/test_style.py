"""The code base stays ruff-clean (the rules are in pyproject.toml) and keeps the house's layout.

The layout (docs/architecture.md): shared floors (``dpadmm.privacy``, ``dpadmm.models``, ``dpadmm.data``,
``dpadmm.runs``, ``dpadmm.native``) import no family; families (``dpadmm.iadmm``, ...) import the
floors; nothing imports in a circle, counting imports inside functions too.
"""

from __future__ import annotations

import ast
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
    modules = sorted(_modules())
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m == 'flwr' or m.startswith('flwr.')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "dpadmm.iadmm.engine" in modules and "dpadmm.privacy.ledger" in modules


FLOORS = ("dpadmm.privacy", "dpadmm.models", "dpadmm.data", "dpadmm.runs", "dpadmm.native", "dpadmm.catalog",
          "dpadmm.wire", "dpadmm.keys")
FAMILIES = ("dpadmm.iadmm", "dpadmm.linadmm", "dpadmm.sharing", "dpadmm.decentral")


def _modules() -> dict[str, Path]:
    """Every module of the core package by dotted name (a package by its own name)."""
    found = {}
    for path in (ROOT / "dpadmm").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    """The core modules ``path`` imports anywhere in its body (``from a import b`` counts a.b if a module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n in known}


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_shared_floors_import_no_family() -> None:
    modules = _modules()
    wrong = {name: sorted(n for n in _imports(path, set(modules)) if _under(n, FAMILIES))
             for name, path in modules.items() if _under(name, FLOORS)}
    assert not {k: v for k, v in wrong.items() if v}
    assert all(_under(name, FLOORS + FAMILIES) or name.count(".") == 1 or name == "dpadmm"
               for name in modules), "a module outside the floors, the families and the top-level modules"


def test_no_module_imports_in_a_circle() -> None:
    modules = _modules()
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    # a package's __init__ importing its own submodules is not a circle of design; drop package -> child edges
    graph = {name: {n for n in edges if not n.startswith(name + ".")} for name, edges in graph.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend(path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt])  # the loop
                return True
            if nxt not in state and visit(nxt, path + [node]):
                return True
        state[node] = 2
        return False

    for start in sorted(graph):
        if start not in state and visit(start, []):
            break
    assert not cycle, " -> ".join(cycle)
