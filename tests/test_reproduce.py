"""`dpadmm reproduce`: the grid, resuming, the report (results.csv, summary.md, figures)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from dpadmm.iadmm import engine, privacy
from dpadmm.iadmm.reproduce import GridConfig, cell_name, collect, estimate, run_grid
from dpadmm.runs.grid import GridOptions
from dpadmm.runs.results import failure, read_metrics

ROUNDS = 4


def _grid(out: Path, mnist_dir: Path, **kw) -> GridConfig:
    values = dict(out=str(out), datasets=("mnist",), algorithms=("iadmm", "objpm"), eps=(0.5,), seeds=2,
                  rounds=ROUNDS, eval_every=2, mnist_dir=str(mnist_dir), iadmm_steps=(1,))
    return GridConfig(**(values | kw))


def _final_error(out: Path, cell: str, seed: int) -> float:
    return read_metrics(out / "runs" / cell / f"seed-{seed}")[-1]["test-error"]


def test_grid_cells_use_the_papers_calibration() -> None:
    cells = GridConfig(femnist_dir="somewhere").cells()
    # two data sets; iadmm with E = 1 and 10; objp, objpm, outp and objt with either radius, x five eps
    assert len(cells) == 2 * (2 + 5 * 5)
    assert len({cell_name(c) for c in cells}) == len(cells)
    assert {c.trust_radius for c in cells if c.algorithm == "objt"} == {"paper", "reference"}
    assert {c.steps for c in cells if c.algorithm == "iadmm"} == {1, 10}
    assert {cell_name(c) for c in cells if c.dataset == "mnist" and c.algorithm in ("iadmm", "objt")
            and c.effective_epsilon in (math.inf, 5.0)} == {
        "mnist-iadmm-epsinf", "mnist-iadmm-E10-epsinf", "mnist-objt-eps5", "mnist-objt-reference-eps5"}
    assert {c.sensitivity for c in cells} == {"data-dependent"}
    assert {(c.dataset, c.num_agents) for c in cells} == {("mnist", 10), ("femnist", 195)}
    assert {c.steps for c in cells if c.algorithm == "objpm"} == {10}
    assert all(c.rounds == 20000 and c.eval_every == 200 for c in cells)
    with pytest.raises(ValueError, match="femnist-dir"):
        GridConfig().cells()
    with pytest.raises(ValueError, match="algorithms='sgd' is not allowed"):
        GridConfig(algorithms=("sgd",))


@pytest.mark.slow  # a grid of several cells, run again to resume it, and its report
def test_run_report_resume(tmp_path: Path, mnist_dir: Path) -> None:
    out = tmp_path / "grid"
    logged: list[str] = []
    # before it starts, the wall time: each kind of cell timed by a short probe with the cell's seeds
    estimated = estimate(_grid(out, mnist_dir))
    assert estimated.units == estimated.probes == 2 and estimated.seconds > 0
    assert estimated.line().startswith("reproduce: estimated wall time about ")
    run_grid(_grid(out, mnist_dir), GridOptions(progress=False), log=logged.append)
    assert any("data-dependent" in line for line in logged)  # says which calibration it uses
    # results.csv: one row per cell x seed x evaluated round
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == (1 + 2) * (ROUNDS // 2)  # iadmm: seed 0 alone (no noise, nothing depends on it)
    assert {(r["algorithm"], r["eps"], r["seed"]) for r in rows} == {
        ("iadmm", "inf", "0"), ("objpm", "0.5", "0"), ("objpm", "0.5", "1")}
    # summary.md: the papers' numbers next to ours, and the ledger of each cell
    summary = (out / "summary.md").read_text()
    assert "9.10 (003, non-private)" in summary and "nominal" in summary
    assert "\n## References\n\n- **003**: Minseok Ryu" in summary  # written here, so a rebuilt page keeps it
    assert "**Shortened grid.** MNIST: T = 4 of the papers' 20,000 rounds, 2 of 10 seeds." in summary
    config = next(c for c in _grid(out, mnist_dir).cells() if c.algorithm == "objpm")
    ledger = privacy.ledger(config, total_samples=60000)
    assert f"| {ledger.whole_run.epsilon_pld:.3g} |" in summary
    errors = sorted(float(r["test_error"]) for r in rows if r["algorithm"] == "objpm" and r["round"] == "4")
    assert f"{100 * errors[0]:.2f}" in summary  # the best of the two seeds
    for name in ("fig1-test-error", "fig2-best-error-vs-eps", "fig3-noise", "fig5-consensus"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a second call skips the completed cells
    assert estimate(_grid(out, mnist_dir)).units == 0
    logged.clear()
    run_grid(_grid(out, mnist_dir), GridOptions(progress=False), log=logged.append)
    assert sum("complete, skipped" in line for line in logged) == 2

    # an interrupted cell (checkpoint of round 2, no cell.json) resumes to the uninterrupted result
    cell = out / "runs" / cell_name(config)
    expected = [_final_error(out, cell.name, s) for s in (0, 1)]
    (cell / "cell.json").unlink()
    short = dataclasses.replace(config, rounds=2)
    engine.run_seeds(short, [0, 1], progress=False, directories=[cell / "seed-0", cell / "seed-1"],
                     checkpoint=cell / "checkpoint.pt")
    saved = torch.load(cell / "checkpoint.pt", weights_only=True)
    saved["config"] = config.to_mapping()
    torch.save(saved, cell / "checkpoint.pt")
    logged.clear()
    run_grid(_grid(out, mnist_dir), GridOptions(progress=False), log=logged.append)
    assert any(cell.name in line and "resuming" in line for line in logged)
    assert [_final_error(out, cell.name, s) for s in (0, 1)] == expected
    assert not (cell / "checkpoint.pt").exists() and (cell / "cell.json").exists()
    assert len(collect(out)) == len(rows)

    # the same folder with other settings for an existing cell is refused, never overwritten
    with pytest.raises(ValueError, match="other settings"):
        run_grid(_grid(out, mnist_dir, rounds=6), GridOptions(progress=False), log=logged.append)


@pytest.mark.slow  # a grid of four cells, run again to skip them, and its report
def test_open_settings_get_cells_of_their_own(tmp_path: Path, mnist_dir: Path) -> None:
    """objt with both trust radii and iadmm with two E: a cell, a label and a line each; a cell recorded
    before those keys existed is still recognised as complete."""
    out = tmp_path / "grid"
    grid = _grid(out, mnist_dir, algorithms=("iadmm", "objt"), iadmm_steps=(1, 2), seeds=1, rounds=2)
    run_grid(grid, GridOptions(progress=False), log=lambda _: None)
    assert sorted(p.name for p in (out / "runs").iterdir()) == [
        "mnist-iadmm-E2-epsinf", "mnist-iadmm-epsinf", "mnist-objt-eps0.5", "mnist-objt-reference-eps0.5"]
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["algorithm"], r["local_steps"]) for r in rows} == {
        ("iadmm", "1"), ("iadmm-E2", "2"), ("objt", "1"), ("objt-reference", "1")}
    summary = (out / "summary.md").read_text()
    assert "| objt-reference | 0.5 | 1 | 2 |" in summary and "| iadmm-E2 | non-private | 2 | 2 |" in summary
    assert summary.count("7.84 (000)") == 0 and summary.count("12.80 (000)") == 0  # eps 0.5: none quoted
    for cell, radius in (("mnist-objt-eps0.5", "paper"), ("mnist-objt-reference-eps0.5", "reference")):
        header = json.loads((out / "runs" / cell / "seed-0" / "config.json").read_text())
        assert header["trust-radius"] == radius
    done = out / "runs" / "mnist-objt-eps0.5" / "cell.json"
    record = json.loads(done.read_text())
    del record["config"]["trust-radius"]  # as written before the key existed
    done.write_text(json.dumps(record))
    done = out / "runs" / "mnist-iadmm-epsinf" / "cell.json"
    record = json.loads(done.read_text())
    record["seeds"] = [0, 1, 2]  # as written when non-private cells ran every seed
    assert record["config"]["local-steps"] == 0  # E = 1 by default, as cells recorded earlier say
    done.write_text(json.dumps(record))
    for seed in (1, 2):
        shutil.copytree(done.parent / "seed-0", done.parent / f"seed-{seed}")
    logged: list[str] = []
    run_grid(grid, GridOptions(progress=False), log=logged.append)
    assert sum("complete, skipped" in line for line in logged) == 4


def test_bad_grid_values_are_named() -> None:
    with pytest.raises(ValueError, match="eps=.* finite"):
        GridConfig(eps=(math.inf,))
    with pytest.raises(ValueError, match="seeds=0"):
        GridConfig(seeds=0)
    with pytest.raises(ValueError, match="trust-radii='huge' is not allowed; choose among paper, reference"):
        GridConfig(trust_radii=("huge",))
    with pytest.raises(ValueError, match="iadmm-steps='0' is not allowed"):
        GridConfig(iadmm_steps=(0,))


@pytest.mark.slow
def test_a_cell_whose_run_fails_is_not_complete_and_runs_again(tmp_path: Path, mnist_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell whose run raises in round 3 (a fault injected into the engine's round, as a crash would) leaves
    its seed folder marked failed (failed.json, with the metrics of round 2) and no cell.json: the report
    does not take it for a result, and the next call runs the cell again, to a folder no longer failed."""
    out = tmp_path / "grid"
    grid = _grid(out, mnist_dir, algorithms=("iadmm",), seeds=1)
    cell = out / "runs" / "mnist-iadmm-epsinf"
    real_step = engine.step

    def crashing(config: object, data: object, state: object, t: int, *args: object, **kw: object) -> object:
        if t == 3:
            raise RuntimeError("the device ran out of memory in round 3")
        return real_step(config, data, state, t, *args, **kw)

    monkeypatch.setattr(engine, "step", crashing)
    with pytest.raises(RuntimeError, match="out of memory"):
        run_grid(grid, GridOptions(progress=False), log=lambda _: None)
    assert failure(cell / "seed-0") == {"reason": "the device ran out of memory in round 3",
                                        "error": "RuntimeError", "last-round": 2, "completed-rounds": 2}
    assert [r["round"] for r in read_metrics(cell / "seed-0")] == [2]
    assert not (cell / "cell.json").exists() and collect(out) == []

    monkeypatch.undo()
    logged: list[str] = []
    run_grid(grid, GridOptions(progress=False), log=logged.append)
    assert any(cell.name in line and "running" in line for line in logged)
    assert failure(cell / "seed-0") is None and (cell / "cell.json").exists()
    assert [r["round"] for r in read_metrics(cell / "seed-0")] == [2, 4]
    assert len(collect(out)) == ROUNDS // 2
