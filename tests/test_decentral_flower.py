"""Paper 004 on Flower for real: `flwr run .` with one SuperNode per agent and a ServerApp that only routes
the exchanged iterates along the graph equals the engine iteration by iteration."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpadmm.decentral import engine
from dpadmm.decentral.config import DecentralConfig
from dpadmm.runs.results import read_metrics
from tests.conftest import flwr_run, toml_value

pytestmark = pytest.mark.slow


def _run_config(config: DecentralConfig) -> str:
    keys = {k: v for k, v in config.to_mapping().items() if k != "algorithm"}
    return f"algorithm='{config.algorithm}' " + " ".join(f"decentral.{k}={toml_value(v)}"
                                                         for k, v in keys.items())


@pytest.mark.parametrize("algorithm", ["ldp-admm", "ldp-dgd-star"])
def test_flower_run_equals_the_engine_iteration_by_iteration(algorithm: str, flwr_env: dict[str, str],
                                                             tmp_path: Path, binary_dir: Path) -> None:
    out = tmp_path / "flower"
    config = DecentralConfig(algorithm=algorithm, agents=5, edges=6, rounds=4, seed=3,
                             data_dir=str(binary_dir / "adult"), out=str(out))
    output = flwr_run(flwr_env, _run_config(config), supernodes=5)
    assert "dpadmm iteration 4/4: log-error" in output and "-LDP, pure, a priori" in output
    flower = read_metrics(out)
    local = engine.run(config, write=False, progress=False).records[0]
    assert [r["round"] for r in flower] == [1, 2, 3, 4]
    for ours, theirs in zip(flower, local, strict=True):
        for key in ("log-error", "log-error-max", "consensus", "epsilon"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-12), (key, ours["round"])
