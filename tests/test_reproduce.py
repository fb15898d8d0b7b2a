"""`dpadmm reproduce`: the grid, resuming, the report (results.csv, summary.md, figures)."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from dpadmm import engine, privacy
from dpadmm.reproduce import GridConfig, cell_name, collect, run_grid
from dpadmm.results import read_metrics

ROUNDS = 4


def _grid(out: Path, mnist_dir: Path, **kw) -> GridConfig:
    values = dict(out=str(out), datasets=("mnist",), algorithms=("iadmm", "objpm"), eps=(0.5,), seeds=2,
                  rounds=ROUNDS, eval_every=2, mnist_dir=str(mnist_dir))
    return GridConfig(**(values | kw))


def _final_error(out: Path, cell: str, seed: int) -> float:
    return read_metrics(out / "runs" / cell / f"seed-{seed}")[-1]["test-error"]


def test_grid_cells_use_the_papers_calibration() -> None:
    cells = GridConfig(femnist_dir="somewhere").cells()
    assert len(cells) == 2 * (1 + 4 * 5)  # two data sets; iadmm once, four private algorithms x five eps
    assert {c.sensitivity for c in cells} == {"data-dependent"}
    assert {(c.dataset, c.num_agents) for c in cells} == {("mnist", 10), ("femnist", 195)}
    assert {c.steps for c in cells if c.algorithm == "objpm"} == {10}
    assert all(c.rounds == 20000 and c.eval_every == 200 for c in cells)
    with pytest.raises(ValueError, match="femnist-dir"):
        GridConfig().cells()
    with pytest.raises(ValueError, match="algorithms='sgd' is not allowed"):
        GridConfig(algorithms=("sgd",))


def test_run_report_resume(tmp_path: Path, mnist_dir: Path) -> None:
    out = tmp_path / "grid"
    logged: list[str] = []
    run_grid(_grid(out, mnist_dir), progress=False, log=logged.append)
    assert any("data-dependent" in line for line in logged)  # says which calibration it uses
    # results.csv: one row per cell x seed x evaluated round
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 2 * (ROUNDS // 2)
    assert {(r["algorithm"], r["eps"]) for r in rows} == {("iadmm", "inf"), ("objpm", "0.5")}
    # summary.md: the papers' numbers next to ours, and the ledger of each cell
    summary = (out / "summary.md").read_text()
    assert "9.10 (003, non-private)" in summary and "nominal" in summary
    config = next(c for c in _grid(out, mnist_dir).cells() if c.algorithm == "objpm")
    ledger = privacy.ledger(config, total_samples=60000)
    assert f"| {ledger.whole_run.epsilon_pld:.3g} |" in summary
    errors = sorted(float(r["test_error"]) for r in rows if r["algorithm"] == "objpm" and r["round"] == "4")
    assert f"{100 * errors[0]:.2f}" in summary  # the best of the two seeds
    for name in ("fig1-test-error", "fig2-best-error-vs-eps", "fig3-noise", "fig5-consensus"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a second call skips the completed cells
    logged.clear()
    run_grid(_grid(out, mnist_dir), progress=False, log=logged.append)
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
    run_grid(_grid(out, mnist_dir), progress=False, log=logged.append)
    assert any(cell.name in line and "resuming" in line for line in logged)
    assert [_final_error(out, cell.name, s) for s in (0, 1)] == expected
    assert not (cell / "checkpoint.pt").exists() and (cell / "cell.json").exists()
    assert len(collect(out)) == len(rows)

    # the same folder with other settings for an existing cell is refused, never overwritten
    with pytest.raises(ValueError, match="other settings"):
        run_grid(_grid(out, mnist_dir, rounds=6), progress=False, log=logged.append)


def test_bad_grid_values_are_named() -> None:
    with pytest.raises(ValueError, match="eps=.* finite"):
        GridConfig(eps=(math.inf,))
    with pytest.raises(ValueError, match="seeds=0"):
        GridConfig(seeds=0)
