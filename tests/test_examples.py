"""The plug-in proof: examples/plugin_app, a separate Flower app with its own network, runs our strategy.

The example is what a user writes: its ServerApp builds ``strategies.DPIADMM`` with its own
initial parameters and evaluates w itself; its ClientApp answers with ``clients.dpiadmm``'s
helpers, its own module and its own data. These tests check that it uses only the public
entry points (never dpadmm's own ServerApp or ClientApp) and that a real ``flwr run`` of it
trains: every agent answers every round, w moves and the test accuracy rises above chance.
"""

from __future__ import annotations

import ast
import json
import sys
import tomllib
from pathlib import Path

import pytest

from dpadmm.iadmm.config import papers
from tests.conftest import ROOT, flwr_run

EXAMPLE = ROOT / "examples" / "plugin_app"
PACKAGE = EXAMPLE / "plugin_app"

# The project's packages, and which of their modules an app may import: the strategy, the client
# helpers and the core library. server.server_app and clients.client_app are our own app.
PROJECT = {"dpadmm", "strategies", "clients", "server", "benchmarks", "tests"}
PUBLIC = ("dpadmm", "strategies", "clients.dpiadmm")
THIRD_PARTY = {"torch", "flwr", "numpy"}


def _imports(path: Path) -> list[str]:
    """Every module a source file imports, as dotted names (``from a import b`` gives ``a.b``)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import; a Flower app loads its modules by name"
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _is_public(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in PUBLIC)


def test_the_example_imports_only_public_entry_points() -> None:
    sources = sorted(PACKAGE.glob("*.py"))
    assert {p.name for p in sources} >= {"__init__.py", "model.py", "client_app.py", "server_app.py"}
    used = set()
    for path in sources:
        for name in _imports(path):
            root = name.split(".")[0]
            if root in PROJECT:
                assert _is_public(name), f"{path.name} imports {name}, which is not a public entry point"
                used.add(name)
            else:
                allowed = root in sys.stdlib_module_names or root in THIRD_PARTY or root == "plugin_app"
                assert allowed, f"{path.name} imports {name}: a dependency the example does not declare"
    # It really plugs in our strategy and helpers (and not by copying them).
    assert {"strategies.DPIADMM", "clients.dpiadmm.answer_query", "clients.dpiadmm.train_reply",
            "dpadmm.models.modules.initial_parameters", "dpadmm.models.modules.logits_of"} <= used

    # Its own network: defined in the example, not one of dpadmm's built-in models.
    model = ast.parse((PACKAGE / "model.py").read_text())
    assert [n.name for n in model.body if isinstance(n, ast.ClassDef)] == ["TinyCNN"]

    # Its own app: components in its own package, run-config keys that dpadmm knows or it filters.
    app = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "plugin_app.server_app:app",
                                 "clientapp": "plugin_app.client_app:app"}
    known = set(papers().to_mapping())
    assert set(app["config"]) - known == {"conv-channels"}
    assert "flwr run examples/plugin_app" in (EXAMPLE / "README.md").read_text()


@pytest.mark.slow
def test_the_example_app_trains_through_a_real_flower_run(flwr_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "plugin-run"
    output = flwr_run(flwr_env, f"rounds=3 out='{out}'", supernodes=4, app=EXAMPLE, timeout=300)
    assert "plugin_app round 3/3: test accuracy" in output
    assert "privacy (objpm, gaussian noise, clipped sensitivity" in output  # the ledger's summary

    results = json.loads((out / "results.json").read_text())
    assert results["config"]["num-agents"] == 4 and results["app"]["conv-channels"] == 4
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for record in rounds:  # every agent was asked and answered, every round
        assert record["sampled"] == record["replied"] == [0, 1, 2, 3]
        assert record["rejected"] == [] and record["no_reply"] == []
    spent = [r["privacy_spent"] for r in rounds]
    assert 0 < spent[0] < spent[1] < spent[2] <= results["privacy"]["whole_run"]["epsilon_pld"] * (1 + 1e-9)

    # Each round evaluates the model after its agents' releases (Flower's convention): round 1's has moved.
    moved = [r["distance-from-initial"] for r in rounds]
    assert 0 < moved[0] < moved[1] < moved[2]
    accuracy = [r["test-accuracy"] for r in rounds]
    assert accuracy[0] > 0.3 and accuracy[2] > max(0.6, accuracy[0]), accuracy  # 10 classes: chance is 0.1
    # its statement, with the randomness its agents reported, in one line at the end
    assert "plugin_app: test error" in output and "simulation randomness" in output
