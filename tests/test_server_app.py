"""The Flower app for real: `flwr run .` (a local SuperLink, simulation on Ray), offline.

Equivalence: one configuration through a real Flower simulation and through the batched
engine gives the same w after every round.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from dpadmm.iadmm import engine
from dpadmm.iadmm import privacy as iadmm_privacy
from dpadmm.iadmm.config import main_job, papers
from dpadmm.privacy.device import Device, status
from dpadmm.runs.results import read_jsonl, read_metrics
from server import server_app
from strategies import DPIADMM
from tests.conftest import ROOT, flat_app_config, flwr_run, last_run_status, run_config_of, shipped_app

pytestmark = pytest.mark.slow


def test_the_bundle_flower_ships_is_the_apps_code_and_the_tests_run_it() -> None:
    """`flwr run .` ships pyproject.toml and the four packages' modules to every node, nothing else (no docs,
    results or benchmarks), and the unpacked bundle the tests run builds the same bundle byte for byte."""
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(ROOT)
    with zipfile.ZipFile(io.BytesIO(fab)) as bundle:
        names = set(bundle.namelist()) - {".info/CONTENT"}
    packages = ("dpadmm", "server", "clients", "strategies")
    expected = {path.relative_to(ROOT).as_posix() for package in packages
                for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts}
    assert names == expected | {"pyproject.toml"}
    assert "clients/client_app.py" in names and "dpadmm/iadmm/engine.py" in names
    assert build_fab_from_disk(shipped_app()) == fab


def test_flwr_run_works_offline_on_the_embedded_default(flwr_env: dict[str, str], tmp_path: Path) -> None:
    """The main job (Poisson-subsampled Gaussian objective perturbation, budget-first), two rounds: it says
    its whole-run guarantee, and every round's w equals the engine's (the sampled mode on Flower)."""
    out = tmp_path / "default-run"
    output = flwr_run(flwr_env, f"iadmm.rounds=2 iadmm.out='{out}' iadmm.save-weights=true", supernodes=10)
    for t in (1, 2):
        assert f"dpadmm round {t}/2: test error" in output
    # the ServerApp's first line says where it runs: a reused SuperLink (another checkout's) shows at once
    ours = [line for line in output.splitlines() if re.search(r"dpadmm( ServerApp)?:|dpadmm round", line)]
    assert "dpadmm ServerApp: app folder " in ours[0] and f"this run writes {out} (or" in ours[0], ours[:2]
    records = read_metrics(out)
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["replies"] == 10 and r["rejected"] == 0 and r["no-reply"] == 0 for r in records)
    rounds = read_jsonl(out / "rounds.jsonl")  # the operator's report of every round
    assert [r["replied"] for r in rounds] == [list(range(10))] * 2
    assert 0 < rounds[0]["privacy_spent"] < rounds[1]["privacy_spent"] == records[1]["privacy-spent"]
    assert "privacy (objpm, gaussian noise, clipped sensitivity" in output  # the ledger's summary
    ledger = json.loads((out / "privacy.json").read_text())
    assert ledger["whole_run"]["releases"] == 20 and ledger["neighbouring"] == "add-remove"
    assert ledger["whole_run"]["epsilon_pld"] == pytest.approx(8.0, rel=0.01)
    assert f"test error {records[-1]['test-error']:.4f}; privacy: (eps = " in output
    assert "for the whole run (20 releases), per agent" in output

    config = dataclasses.replace(main_job(), rounds=2, out=str(tmp_path / "engine"), save_weights=True)
    engine_w = np.load(engine.run(config, progress=False).directory / "weights.npz")
    flower_w = np.load(out / "weights.npz")
    assert flower_w.files == engine_w.files == ["round-1", "round-2"]
    for key in flower_w.files:
        np.testing.assert_allclose(flower_w[key], engine_w[key], rtol=1e-5, atol=1e-12)


def test_a_bad_key_is_one_error_line_and_a_failed_run(flwr_env: dict[str, str]) -> None:
    """`flwr run . --run-config "iadmm.epsilon=-1"`: one line names the key, the value and what is allowed,
    the configuration checks' own frames are not printed, and the run's status is failed (`flwr run` itself
    exits 0 whatever the run's outcome: Flower's CLI, see server_app.RunConfigError)."""
    output = flwr_run(flwr_env, "iadmm.epsilon=-1")
    message = ("iadmm.epsilon=-1.0 is not allowed; it must be > 0 (inf = non-private; 0 = calibrated to the "
               "whole-run target)")
    lines = [line for line in output.splitlines() if "dpadmm:" in line]
    assert len(lines) == 1 and lines[0].endswith(f"dpadmm: the run config is not allowed: {message}"), lines
    assert "dpadmm/iadmm/config.py" not in output and "round 1" not in output
    status, details = last_run_status(flwr_env)
    assert status == "finished:failed" and details.endswith(message)


def test_the_first_line_names_the_app_folder_the_python_and_the_run_folder(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch
                                                                         ) -> None:
    """flwr run . reuses a SuperLink already on Flower's fixed address, with its environment and working
    folder: the line names the app's code, the Python, the working folder and the run folder it writes (a
    relative ``out`` resolved there), or the one it resumes."""
    monkeypatch.chdir(tmp_path)
    config = server_app.configured({**flat_app_config(), "iadmm.rounds": 2})
    line = server_app.where(config)
    app_folder = Path(server_app.__file__).resolve().parent.parent
    assert line.startswith(f"dpadmm ServerApp: app folder {app_folder}, Python {sys.executable}, ")
    assert f"working folder {tmp_path};" in line
    assert f"this run writes {tmp_path / config.default_out()} (or " in line
    resumed = dataclasses.replace(config, out="resumed")
    (tmp_path / "resumed").mkdir()
    (tmp_path / "resumed" / server_app.CHECKPOINT).write_bytes(b"")
    assert server_app.where(resumed).endswith(f"this run resumes {tmp_path / 'resumed'}")


@pytest.mark.parametrize(("keys", "message"), [
    ({"iadmm.target-epsilon": 1e-9}, "target-epsilon=1e-09 is not achievable with 100 releases"),
    ({"algorithm": "dp-admm", "linadmm.rounds": 0}, "linadmm.rounds=0 is not allowed; it must be >= 1"),
    ({"algorithm": "admm-sharing", "sharing.rho": "x"}, "sharing.rho='x' is not allowed; expected a"),
    ({"algorithm": "ldp-admm", "decentral.graph": "ring"},
     "decentral.graph='ring' is not allowed; choose one of random, complete"),
    ({"algorithm": "sgd"}, "algorithm='sgd' is not allowed; choose one of iadmm,"),
])
def test_every_familys_bad_key_ends_the_serverapp_with_one_line(keys: dict[str, object],
                                                                 message: str) -> None:
    """The ServerApp's main for each family (the same path `flwr run` takes, without the processes)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    flower = logging.getLogger("flwr")
    flower.addHandler(handler)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**flat_app_config(), **keys})
    try:
        with pytest.raises(server_app.RunConfigError, match=re.escape(message)):
            server_app.main(None, context)
    finally:
        flower.removeHandler(handler)
    assert [r.levelno for r in records] == [logging.ERROR]
    assert records[0].getMessage().startswith(f"dpadmm: the run config is not allowed: {message}")


@pytest.mark.parametrize(("algorithm", "partition"), [("objpm", "contiguous"), ("outp", "dirichlet:0.5")])
def test_flower_simulation_equals_the_engine(algorithm: str, partition: str, flwr_env: dict[str, str],
                                            tmp_path: Path) -> None:
    """Also under a skewed partition (the run-config keys ``partition`` and ``partition-seed``): the
    ClientApps deal themselves the engine's blocks."""
    steps = 2 if algorithm == "objpm" else 1
    config = papers(algorithm=algorithm, epsilon=0.5, rounds=3, local_steps=steps, num_agents=5, seed=7,
                       partition=partition, partition_seed=3, out=str(tmp_path / "flower"), save_weights=True)
    flwr_run(flwr_env, run_config_of(config), supernodes=5)
    flower_w = np.load(tmp_path / "flower" / "weights.npz")
    flower_metrics = read_metrics(tmp_path / "flower")
    assert all(r["replies"] == 5 and r["rejected"] == 0 for r in flower_metrics)

    batched = engine.run(dataclasses.replace(config, out=str(tmp_path / "engine")), progress=False)
    engine_w = np.load(batched.directory / "weights.npz")
    assert flower_w.files == engine_w.files == ["round-1", "round-2", "round-3"]
    for key in flower_w.files:
        np.testing.assert_allclose(flower_w[key], engine_w[key], rtol=1e-5, atol=1e-12)
    assert abs(engine_w["round-3"]).max() > 0  # something was learned
    for ours, theirs in zip(flower_metrics, batched.records, strict=True):
        assert ours["test-error"] == theirs["test-error"]


@pytest.mark.parametrize(("model", "mechanism", "keys"), [
    ("mlp", "laplace", {}),
    ("mlp", "gaussian", {"local_start": "global", "release": "last", "server_update": "mean"}),
    ("scatter-cnn", "gaussian", {"local_start": "global"}),
])
def test_a_network_through_flower_equals_the_engine(model: str, mechanism: str, keys: dict[str, str],
                                                   flwr_env: dict[str, str], tmp_path: Path) -> None:
    """model=mlp: dicts of parameter tensors on the wire, per-sample clipping and minibatches in the
    ClientApps; every round's parameters equal the engine's (which vmaps the agents). The papers' round,
    and FedAvg's shape of it: local steps from w, the last iterate sent, the mean release as the server's
    w. model=scatter-cnn: each ClientApp computes its images' scattering features itself."""
    config = papers(model=model, mechanism=mechanism, epsilon=2.0, clip_norm=5.0, batch_size=32, rounds=2,
                    local_steps=2, num_agents=4, seed=5, out=str(tmp_path / "flower"), save_weights=True,
                    **keys)
    flwr_run(flwr_env, run_config_of(config), supernodes=4)
    flower_w = np.load(tmp_path / "flower" / "weights.npz")
    assert all(r["replies"] == 4 and r["rejected"] == 0 for r in read_metrics(tmp_path / "flower"))

    batched = engine.run(dataclasses.replace(config, out=str(tmp_path / "engine")), progress=False)
    engine_w = np.load(batched.directory / "weights.npz")
    layers = ["fc1", "fc2"] if model == "mlp" else ["conv1", "conv2", "fc1", "fc2"]
    names = [f"{layer}.{kind}" for layer in layers for kind in ("weight", "bias")]
    assert flower_w.files == engine_w.files == [f"round-{t}.{n}" for t in (1, 2) for n in names]
    for key in flower_w.files:
        np.testing.assert_allclose(flower_w[key], engine_w[key], rtol=1e-6, atol=1e-10)
    assert not np.allclose(engine_w["round-2.fc1.weight"], engine_w["round-1.fc1.weight"])  # it moved


def test_a_federation_of_the_wrong_size_is_named(flwr_env: dict[str, str], tmp_path: Path) -> None:
    """Flower simulates 2 SuperNodes unless told otherwise: the nodes say so, with the fix, when the server
    asks who they are before round 1; the run fails without a run folder."""
    output = flwr_run(flwr_env, f"iadmm.num-agents=3 iadmm.rounds=1 iadmm.out='{tmp_path / 'run'}'")
    reason = ("the federation has 2 SuperNodes but num-agents=3 needs 3, one per agent: flwr run . "
              "--federation-config 'num-supernodes=3'")
    assert "dpadmm: the run cannot go on: node" in output and reason in output
    assert "[ROUND 1" not in output and not (tmp_path / "run").exists()
    status, details = last_run_status(flwr_env)
    assert status == "finished:failed" and reason in details


def test_the_femnist_federation_of_195_writers_equals_the_engine(flwr_env: dict[str, str], tmp_path: Path,
                                                                 femnist_dir: Path) -> None:
    """The papers' FEMNIST federation at full size: 195 SuperNodes, one per writer, on Ray."""
    config = papers(dataset="femnist", data_dir=str(femnist_dir), num_agents=195, rounds=2, seed=3,
                       dtype="float32", out=str(tmp_path / "flower"), save_weights=True)
    output = flwr_run(flwr_env, run_config_of(config), supernodes=195,
                      federation=("client-resources-num-cpus=1",))
    assert "dpadmm round 2/2: test error" in output
    assert [r["replied"] for r in read_jsonl(tmp_path / "flower" / "rounds.jsonl")] == [list(range(195))] * 2
    flower_w = np.load(tmp_path / "flower" / "weights.npz")
    engine_w = np.load(engine.run(dataclasses.replace(config, out=str(tmp_path / "engine")),
                                  progress=False).directory / "weights.npz")
    for key in ("round-1", "round-2"):
        np.testing.assert_allclose(flower_w[key], engine_w[key], rtol=1e-4, atol=1e-6)


def test_the_run_folder_names_the_run_as_its_devices_do(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """config.json records the run identity the strategy sends its nodes (``run-identity``), under which each
    deployed device's `dpadmm node status` lists its charge for the run: the server's folder and the devices
    name the same run alike (the folder held no identity, so an operator could not tell which it was)."""
    config = dataclasses.replace(main_job(), out=str(tmp_path / "run"))
    strategy = DPIADMM(config, {"weight": torch.zeros(784, 10)})
    with caplog.at_level(logging.INFO, logger="flwr"), server_app.run_folder(
            config, None, run_identity=strategy.run_identity) as writer:
        pass
    said = (f"dpadmm: writing {writer.directory.resolve() / 'metrics.jsonl'} (run identity "
            f"{strategy.run_identity}, as `dpadmm node status` names the run on each device)")
    assert said in caplog.messages
    assert json.loads((writer.directory / "config.json").read_text())["run-identity"] == strategy.run_identity
    Device(tmp_path / "state", 0).admit(strategy.run_identity, iadmm_privacy.device_request(config, "data-d"))
    assert f"\n  run {strategy.run_identity}: objpm, gaussian, (eps = 7.99" in status(tmp_path / "state")
