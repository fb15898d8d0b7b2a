"""dpadmm.sharing.reproduce (`dpadmm reproduce --paper 001`): a small grid on real a9a, resuming; the privacy
of a noise level. (The same numbers on Ray workers and on any thread count: tests/test_cluster.py.)"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from dpadmm.privacy.ledger import Release, pld_epsilon
from dpadmm.runs.grid import CellsFailed, GridOptions
from dpadmm.sharing import engine, privacy
from dpadmm.sharing.reproduce import Grid, best_step, estimate, implied_epsilon, mean_curves, run_grid

QUIET = GridOptions(progress=False)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow  # a grid of several cells, run again to resume it, and its report
def test_a_small_grid_runs_resumes_and_reports(tmp_path: Path, binary_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    grid = Grid(out=str(tmp_path / "r"), data_dir=str(binary_dir), datasets=("a9a",), epochs=4,
                sigmas=(1.0, 100.0), eps=(1.0,), seeds=2, rates=(1.0, 3.0), rhos=(1.0, 2.0))
    estimated = estimate(grid)  # before it starts: ADMM's 2 rhos, 2 modes x 2 sigmas, Theorem 3's; SGD
    assert estimated.units == 2 + 2 * 2 + 1 + 1 and estimated.probes == 4 and estimated.seconds > 0
    assert "not included: the scikit-learn baselines" in estimated.line()
    first = ["a9a/problem", "a9a/scikit-learn/all-features", "a9a/scikit-learn/party-1-alone",
             "a9a/ADMM/no-noise/rho=1", "a9a/ADMM/no-noise/rho=2", "a9a/SGD"]

    # a call whose ADMM runs fail: the other stage-1 cells are committed, the noisy cells wait
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(engine, "run", broken)
    logged: list[str] = []
    with pytest.raises(CellsFailed, match="2 cells failed .* a9a/ADMM/no-noise/rho=1: RuntimeError"):
        run_grid(grid, QUIET, log=logged.append)
    assert [line for line in logged if line.endswith(": complete")] == [
        f"{key}: complete" for key in first if "ADMM" not in key]
    assert "a9a: its noisy cells wait for the next call (no noise-free ADMM run or problems row)" in logged
    monkeypatch.undo()

    # the next call runs what is missing: stage 1's ADMM, then stage 2 at the rho it chose
    logged.clear()
    out = run_grid(grid, QUIET, log=logged.append)
    assert sum(line.endswith(": complete, skipped") for line in logged) == 4
    keys = [line.removesuffix(": complete") for line in logged if line.endswith(": complete")]
    assert keys[:2] == first[3:5] and len(keys) == 2 + 2 * 2 + 1
    assert keys[-1].startswith("a9a/ADMM/message-noise/eps=1/rho=")
    base = {r["model"]: r for r in _rows(out / "baselines.csv")}
    # party 1's columns are a restriction of all columns: scikit-learn's optimum cannot be lower
    assert float(base["all features"]["train_objective"]) < float(base["party 1 alone"]["train_objective"])
    curves = _rows(out / "curves.csv")
    # ADMM: 2 rhos noise-free, 2 modes x 2 sigmas x 2 seeds, Theorem 3's sigma x 2 seeds; SGD: 2 x 2
    assert len(curves) == 4 * (2 + 2 * 2 * 2 + 2 + 2 * 2)
    theorem = [r for r in curves if r["eps"] == "1"]
    c = float(_rows(out / "problems.csv")[0]["sensitivity"])
    assert c == pytest.approx(2 * 10 * math.sqrt(32561))
    assert float(theorem[0]["sigma"]) == pytest.approx(privacy.theorem_3_std(1.0, grid.delta, c), rel=1e-8)
    means = mean_curves(curves)
    rho = best_step(means, "a9a", "ADMM")
    assert {float(r["step"]) for r in curves if r["method"] == "ADMM" and r["noise"] != "none"} == {rho}
    free = means[("a9a", "ADMM", "none", 0.0, rho)]
    assert free["epoch"] == [1, 2, 3, 4] and free["train_objective"][-1] < free["train_objective"][0]
    # the noise is keyed by seed: the two seeds of a noisy cell differ, so the table has a spread
    assert means[("a9a", "ADMM", "message", 100.0, rho)]["test_log_loss_std"][-1] > 0
    report = (out / "summary.md").read_text()
    assert "| a9a | 66,57 | 32561 | 16281 | all features |" in report
    assert "(Theorem 3, eps = 1)" in report and "beats party 1 alone" in report
    # written here, so a rebuilt page keeps them
    assert "\n## References\n\n- **001**: Yaochen Hu" in report and "*FDML:" in report
    for figure in ("fig1-a9a.png", "fig3-noise.png"):
        assert (out / figure).stat().st_size > 0
    before = (out / "curves.csv").read_text()
    assert estimate(grid).units == 0
    logged.clear()
    run_grid(grid, QUIET, log=logged.append)  # every cell complete: none runs
    assert logged == [f"{key}: complete, skipped" for key in first + keys[2:]]
    assert (out / "curves.csv").read_text() == before
    with pytest.raises(ValueError, match="seeds: 2 there, 3 now"):
        run_grid(Grid(**{**grid.__dict__, "seeds": 3}), QUIET, log=lambda _: None)


def test_the_privacy_of_a_noise_level_is_the_composed_gaussian_mechanism() -> None:
    """T Gaussian releases compose exactly to one of multiplier (sigma / C) / sqrt(T): the PLD accountant
    agrees, and Theorem 3's sigma for eps = 1 gives at most eps = 1 per round (its bound is not tight)."""
    c, delta = 100.0, 1e-5
    for sigma, rounds in ((300.0, 1), (300.0, 20), (2000.0, 100)):
        exact = implied_epsilon(sigma, c, rounds, delta)
        assert exact == pytest.approx(pld_epsilon(Release("gaussian", sigma / c), rounds, delta), rel=2e-2)
    assert implied_epsilon(privacy.theorem_3_std(1.0, delta, c), c, 1, delta) < 1.0
    assert implied_epsilon(0.001, c, 1, delta) > 1e4


@pytest.mark.parametrize(("change", "message"), [
    ({"datasets": ("gisette",)}, "datasets='gisette' is not allowed"),
    ({"sigmas": (0.0,)}, "sigmas=.* not allowed"),
    ({"eps": (2.0,)}, "epsilon=2.0 is not allowed"),
    ({"seeds": 0}, "seeds=0"),
    ({"rhos": (0.5,)}, "rhos=\\(0.5,\\) is not allowed; give finite values >= 1"),
    # inf reads as non-private in the family: the grid ran its cells, then refused, leaving a report
    ({"eps": (1.0, math.inf)}, "eps='1.0,inf' is not allowed: 001's figures are private runs"),
])
def test_bad_grids_are_named(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Grid(**change)
