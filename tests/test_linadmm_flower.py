"""DP-ADMM / DP-AccADMM (002) on Flower for real: `flwr run .` with the family's keys equals the engine.

The clients hold contiguous blocks of ijcnn1's rows and return their clipped gradient sums;
the server adds the noise once and takes the iteration. The metrics of every iteration match
the batched engine's, which computes the same gradient as one sum.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpadmm.linadmm import engine
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.runs.results import read_metrics
from tests.conftest import flwr_run, toml_value

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("algorithm", ["dp-admm", "dp-accadmm"])
def test_flower_run_equals_the_engine_round_by_round(algorithm: str, flwr_env: dict[str, str],
                                                     tmp_path: Path, binary_dir: Path) -> None:
    out = tmp_path / "flower"
    restart = "goldstein" if algorithm == "dp-accadmm" else "none"
    config = LinAdmmConfig(algorithm=algorithm, restart=restart, target_epsilon=0.5, rounds=4,
                           dataset="ijcnn1", data_dir=str(binary_dir / "ijcnn1"), num_agents=3, seed=5,
                           out=str(out))
    keys = {k: v for k, v in config.to_mapping().items() if k != "algorithm"}
    family_keys = " ".join(f"linadmm.{k}={toml_value(v)}" for k, v in keys.items())
    run_config = f"algorithm='{algorithm}' {family_keys}"
    output = flwr_run(flwr_env, run_config, supernodes=3)
    assert "dpadmm round 4/4: objective" in output and "Theorem 1 of 002" in output
    flower = read_metrics(out)
    local = engine.run(config, write=False, progress=False).records[0]
    assert [r["round"] for r in flower] == [1, 2, 3, 4]
    for ours, theirs in zip(flower, local, strict=True):
        for key in ("objective", "objective-avg", "test-accuracy", "primal-residual"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-12), (key, ours["round"])
    ledger = json.loads((out / "privacy.json").read_text())
    assert ledger["calibration"] == "Theorem 1 (002)" and ledger["whole_run"]["releases"] == 4
    assert json.loads((out / "config.json").read_text())["engine"] == "flower"


def test_the_server_refuses_the_papers_dual_start_before_it_writes_anything(tmp_path: Path,
                                                                           binary_dir: Path) -> None:
    """dual-init = paper needs an un-noised full gradient that the Flower clients do not send: the
    strategy refuses it, and no run folder is left behind that looks like a run."""
    from server.server_app import linadmm_main

    out = tmp_path / "refused"
    config = LinAdmmConfig(dataset="ijcnn1", data_dir=str(binary_dir / "ijcnn1"), dual_init="paper",
                           out=str(out))
    with pytest.raises(ValueError, match="dual-init='paper' is not allowed on Flower"):
        linadmm_main(None, config)  # type: ignore[arg-type]  # refused before the grid is used
    assert not out.exists()
