"""The plug-in proof: the examples are separate Flower apps with their own networks that run our strategy.

An example is what a user writes: its ServerApp builds ``strategies.DPIADMM`` with its own
initial parameters and evaluates the model itself; its ClientApp answers with ``clients.dpiadmm``'s
helpers, its own module and its own data. ``examples/plugin_app`` is the minimal one;
``examples/digits_app`` trains one task with DP-IADMM, with Flower's FedAvg over clients that run
Opacus's DP-SGD, or with Flower's own FedAvg + ``DifferentialPrivacyClientSideFixedClipping``. These tests
check that the examples use only the public entry points (never dpadmm's own ServerApp or ClientApp) and
that real ``flwr run``s of them train: every agent answers every round, the model moves and the test
accuracy rises above chance, and the statements are what the clients ran.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from dpadmm.iadmm.config import papers
from tests.conftest import ROOT, flwr_run, last_run_status

EXAMPLE = ROOT / "examples" / "plugin_app"
PACKAGE = EXAMPLE / "plugin_app"
DIGITS = ROOT / "examples" / "digits_app"

# The project's packages, and which of their modules an app may import: the strategy, the client
# helpers and the core library. server.server_app and clients.client_app are our own app.
PROJECT = {"dpadmm", "strategies", "clients", "server", "benchmarks", "tests"}
PUBLIC = ("dpadmm", "strategies", "clients.dpiadmm")
# opacus and threadpoolctl: the digits app's dp-sgd (the compare extra)
THIRD_PARTY = {"torch", "flwr", "numpy", "sklearn", "opacus", "threadpoolctl"}


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


def _checked_imports(package: Path) -> set[str]:
    """The project modules the files of ``package`` import, each asserted public; other imports must be
    the standard library, a declared dependency or the app's own package."""
    used = set()
    for path in sorted(package.glob("*.py")):
        for name in _imports(path):
            root = name.split(".")[0]
            if root in PROJECT:
                assert _is_public(name), f"{path.name} imports {name}, which is not a public entry point"
                used.add(name)
            else:
                allowed = root in sys.stdlib_module_names or root in THIRD_PARTY or root == package.name
                assert allowed, f"{path.name} imports {name}: a dependency the example does not declare"
    return used


def test_the_example_imports_only_public_entry_points() -> None:
    files = {p.name for p in PACKAGE.glob("*.py")}
    assert files >= {"__init__.py", "model.py", "client_app.py", "server_app.py"}
    used = _checked_imports(PACKAGE)
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


def test_the_example_refuses_a_network_it_cannot_build_before_any_round() -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from plugin_app.settings import settings
    finally:
        sys.path.remove(str(EXAMPLE))
    assert settings({"conv-channels": 2})[1].conv_channels == 2
    for value in (0, 2.5, "4", True):
        refused = rf"^conv-channels={value!r} is not allowed: give an integer >= 1$"
        with pytest.raises(ValueError, match=refused):
            settings({"conv-channels": value})


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


def test_the_digits_app_imports_only_public_entry_points_and_each_method_its_own() -> None:
    """Its DP-IADMM module plugs in our strategy and helpers; its DP-FedAvg module uses Flower's classes and
    its DP-SGD module Opacus's and Flower's FedAvg, neither anything of dpadmm's training; the network is
    the app's own."""
    used = _checked_imports(DIGITS / "digits_app")
    assert {"strategies.DPIADMM", "clients.dpiadmm.answer_query", "clients.dpiadmm.train_reply"} <= used
    flower = set(_imports(DIGITS / "digits_app" / "dpfedavg.py"))
    assert {"flwr.serverapp.strategy.DifferentialPrivacyClientSideFixedClipping",
            "flwr.serverapp.strategy.FedAvg", "flwr.serverapp.RdpAccountant"} <= flower
    assert not {n for n in flower if n.startswith(("strategies", "clients"))}
    opacus = set(_imports(DIGITS / "digits_app" / "dpsgd.py"))
    assert {"opacus.PrivacyEngine", "opacus.data_loader.DPDataLoader", "opacus.accountants.PRVAccountant",
            "opacus.accountants.utils.get_noise_multiplier", "flwr.serverapp.strategy.FedAvg"} <= opacus
    assert not {n for n in opacus if n.startswith(("strategies", "clients"))}
    assert "flwr.clientapp.mod.fixedclipping_mod" in _imports(DIGITS / "digits_app" / "client_app.py")
    task = ast.parse((DIGITS / "digits_app" / "task.py").read_text())
    assert "Net" in [n.name for n in task.body if isinstance(n, ast.ClassDef)]
    app = tomllib.loads((DIGITS / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert set(app["config"]) - set(papers().to_mapping()) == {
        "method", "fedavg-clip", "fedavg-lr", "fedavg-epochs", "fedavg-batch", "dpsgd-lr"}


def test_the_digits_app_refuses_settings_it_cannot_run_and_a_federation_of_another_size() -> None:
    sys.path.insert(0, str(DIGITS))
    try:
        from digits_app.task import client_block, settings
    finally:
        sys.path.remove(str(DIGITS))
    with pytest.raises(ValueError, match=r"method='fedprox' is not one of dpiadmm, dp-fedavg, dp-sgd"):
        settings({"method": "fedprox"})
    # each of its own settings before any round (a negative step made every client raise, and the run
    # ended "completed" with the untrained model)
    refused = {"fedavg-lr": -1.0, "fedavg-clip": 0.0, "dpsgd-lr": float("inf"), "fedavg-epochs": 0,
               "fedavg-batch": -32}
    for key, value in refused.items():
        with pytest.raises(ValueError, match=rf"^{key}={value!r} is not allowed: give (a finite number > 0|"
                                             "an integer >= 1)$"):
            settings({"method": "dp-fedavg", key: value})
    for key, value, wanted in (("fedavg-epochs", 2.5, "an integer"), ("fedavg-lr", "0.1", "a number"),
                               ("method", 1, "a string"), ("fedavg-batch", True, "an integer")):
        with pytest.raises(ValueError, match=rf"^{key}={value!r} is not allowed: give {wanted}$"):
            settings({key: value})
    assert settings({"fedavg-lr": 1})[1].fedavg_lr == 1.0  # an integer for a number
    config, own = settings({"method": "dp-fedavg", "fedavg-clip": 0.3, "rounds": 4, "num-agents": 5})
    assert (own.method, own.fedavg_clip, config.rounds) == ("dp-fedavg", 0.3, 4)
    partition, x, y = client_block({"partition-id": 4, "num-partitions": 5}, config)
    assert partition == 4 and x.shape == (287, 64) and len(y) == 287
    with pytest.raises(ValueError, match='3 SuperNodes but num-agents=5; run with --federation-config '
                                         '"num-supernodes=5"'):
        client_block({"partition-id": 0, "num-partitions": 3}, config)
    sys.path.insert(0, str(DIGITS))
    try:
        from digits_app import dpsgd
        from digits_app.dpfedavg import noise_multiplier
    finally:
        sys.path.remove(str(DIGITS))
    z = noise_multiplier(8.0, 1e-5, 10, 5)
    assert 2.0 < z < 2.05  # Flower's RdpAccountant: 10 Gaussian releases at eps = 8
    for target in (0.0, float("inf"), 1e-6):  # no noise multiplier up to 1000 reaches 1e-6 in 10 rounds
        refused = f"target-epsilon={target!r} is not allowed with method='dp-fedavg'"
        with pytest.raises(ValueError, match=refused):
            noise_multiplier(target, 1e-5, 10, 5)
    # DP-SGD: Opacus's PRV accountant, 100 steps (10 rounds of E = 10) at q = 0.2, as DP-IADMM's defaults
    z = dpsgd.noise_multiplier(8.0, 1e-5, 0.2, 100)
    assert 1.4 < z < 1.5
    for target in (0.0, float("inf"), 1e-6):  # Opacus gives up at z = 1e6 for 1e-6
        refused = f"target-epsilon={target!r} is not allowed with method='dp-sgd'"
        with pytest.raises(ValueError, match=refused):
            dpsgd.noise_multiplier(target, 1e-5, 0.2, 100)


def test_the_digits_apps_dp_sgd_calibrates_while_another_thread_forks() -> None:
    """A simulation's ServerApp calibrates z in a thread of the process whose main thread starts Ray's
    processes. A fork during Opacus's PRV search used to end OpenBLAS's worker threads under a running dot
    product, which then waited for them forever (a `flwr run` that never ended). Here the search runs beside a
    thread that forks as often as it can: it ends, and gives the z it gives alone."""
    sys.path.insert(0, str(DIGITS))
    try:
        from digits_app import dpsgd
    finally:
        sys.path.remove(str(DIGITS))
    search = dpsgd.noise_multiplier.__wrapped__  # uncached: each call searches
    found: list[float] = []
    thread = threading.Thread(target=lambda: found.append(search(8.0, 1e-5, 0.2, 100)), daemon=True)
    thread.start()
    forks = 0
    deadline = time.monotonic() + 120
    while thread.is_alive() and time.monotonic() < deadline:
        subprocess.run(["true"], preexec_fn=lambda: None, check=True)  # preexec_fn: a fork, not a spawn
        forks += 1
    assert not thread.is_alive(), f"the search still runs after 120 s beside {forks} forks"
    assert forks > 10 and found == [search(8.0, 1e-5, 0.2, 100)]


@pytest.mark.slow
def test_a_third_party_app_learns_with_dpiadmm_and_states_what_its_clients_ran(
        flwr_env: dict[str, str], tmp_path: Path) -> None:
    """The digits app copied outside the repository (its own model and data, the public API alone), run by
    `flwr run` on the simulation engine with RunConfig's defaults: the model after each round is evaluated
    (round 1's has learnt), it reaches 0.70 test accuracy in 10 rounds, and its statement is the one its
    clients ran (every reply states its mechanism, and the strategy accepted all of them), with the run's
    randomness and trust model in its one line."""
    app = shutil.copytree(DIGITS, tmp_path / "digits-app", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "results.json"
    output = flwr_run(flwr_env, f"out='{out}'", supernodes=5, app=app, timeout=600)
    results = json.loads(out.read_text())
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 11))
    assert all(r["replied"] == [0, 1, 2, 3, 4] and r["rejected"] == [] for r in rounds)  # all ran it
    accuracy = [r["accuracy"] for r in rounds]
    assert accuracy[0] > 0.2 and accuracy[-1] >= 0.70, accuracy
    assert results["epsilon"] == pytest.approx(8.0, rel=0.01) and results["delta"] == 1e-5
    assert results["mechanism"].startswith("gaussian, noise multiplier")
    assert "(eps = 8, delta = 1e-05) for the whole run" in results["line"]
    assert "simulation randomness" in results["line"] and "the server included" in results["line"]
    assert f"digits_app: {results['line']}" in output


@pytest.mark.slow
def test_the_digits_app_runs_flowers_dp_fedavg_at_the_target_flowers_accountant_reports(
        flwr_env: dict[str, str], tmp_path: Path) -> None:
    """method = dp-fedavg: Flower's wrapper with its accountant, z calibrated to the target for the rounds
    run, reports that target; the global model moves from the initial one (round 0 is the initial model)
    and the statement names its unit and whom it does not cover."""
    out = tmp_path / "results.json"
    output = flwr_run(flwr_env, f"method='dp-fedavg' rounds=3 out='{out}'", supernodes=5, app=DIGITS,
                      timeout=300)
    results = json.loads(out.read_text())
    assert [r["round"] for r in results["rounds"]] == [0, 1, 2, 3]
    assert results["epsilon"] == pytest.approx(8.0, rel=0.002) and results["delta"] == 1e-5
    assert results["noise_multiplier"] > 0
    accuracy = [r["accuracy"] for r in results["rounds"]]
    assert accuracy[1:] != [accuracy[0]] * 3, accuracy
    assert "per client for its whole data set" in results["line"]
    assert "the server sees each client's clipped update without noise" in results["line"]
    assert f"digits_app: {results['line']}" in output


@pytest.mark.slow
def test_the_digits_app_runs_dp_sgd_with_opacus_at_the_target_its_prv_accountant_reports(
        flwr_env: dict[str, str], tmp_path: Path) -> None:
    """method = dp-sgd: Flower's FedAvg over clients that train with Opacus's DP-SGD, z calibrated by Opacus's
    PRV accountant for the rounds run (3 rounds of E = 10 steps at q = 0.2), reports that target; the global
    model learns (round 0 is the initial model) and the statement is sample-level and holds against the
    server."""
    out = tmp_path / "results.json"
    output = flwr_run(flwr_env, f"method='dp-sgd' rounds=3 out='{out}'", supernodes=5, app=DIGITS,
                      timeout=300)
    results = json.loads(out.read_text())
    assert [r["round"] for r in results["rounds"]] == [0, 1, 2, 3]
    assert results["epsilon"] == pytest.approx(8.0, rel=0.01) and results["delta"] == 1e-5
    assert results["noise_multiplier"] > 0 and results["method"] == "dp-sgd"
    accuracy = [r["accuracy"] for r in results["rounds"]]
    assert accuracy[1:] != [accuracy[0]] * 3 and accuracy[3] > 0.5, accuracy  # 10 classes: chance is 0.1
    assert "sample-level" in results["line"] and "the server included" in results["line"]
    assert "Opacus's PRV accountant, 30 steps of DP-SGD at sampling rate 0.2" in results["line"]
    assert "digits_app dp-sgd round 3: test accuracy" in output
    assert f"digits_app: {results['line']}" in output


@pytest.mark.slow
def test_a_digits_app_round_whose_every_reply_failed_stops_the_run_saying_why(
        flwr_env: dict[str, str], tmp_path: Path) -> None:
    """A fault every client repeats (here a federation of 5 SuperNodes for num-agents=4: each client refuses
    its block): Flower's FedAvg would keep the model and go on, and the run would end "completed" with the
    untrained model; the app's strategy (task.StopsWhenEveryReplyFails, which the DP-FedAvg wrapper's
    subclass shares) stops at round 1, naming the clients' error."""
    out = tmp_path / "results.json"
    output = flwr_run(flwr_env, f"method='dp-sgd' num-agents=4 rounds=2 out='{out}'", supernodes=5,
                      app=DIGITS, timeout=300)
    assert "round 1: every client's reply failed (5 of 5; the first: " in output, output[-3000:]
    assert "the federation has 5 SuperNodes but num-agents=4" in output and "[ROUND 2" not in output
    status, details = last_run_status(flwr_env)
    assert status == "finished:failed" and "every client's reply failed" in details
    assert "epsilon" not in json.loads(out.read_text())  # no statement for a run that released nothing
