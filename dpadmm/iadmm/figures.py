"""The papers' figures, drawn from ``dpadmm reproduce``'s rows (PNG files a person can open).

Each figure has one panel per data set (and per eps-bar where the papers draw one), one
line per algorithm, in the same colours everywhere:

- ``fig1-test-error.png``: test error against round, mean over seeds with the 20-80
  percentile band (003 Fig. 1);
- ``fig2-best-error-vs-eps.png``: best (over seeds) final test error against eps-bar, with
  the non-private IADMM as a horizontal line (003 Fig. 2);
- ``fig3-noise.png``: mean noise magnitude against round (003 Fig. 3);
- ``fig5-consensus.png``: consensus violation sum_p |w - z_p| / P against round (000 Fig. 5).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from dpadmm.runs.tables import pyplot

COLOURS = {"iadmm": "black", "objp": "tab:blue", "objpm": "tab:green", "objt": "tab:purple",
           "outp": "tab:red"}


def _style(label: str) -> dict[str, str]:
    """Colour by algorithm; the non-private line dashed, a variant (``objt-reference``, ``iadmm-E10``: see
    :func:`dpadmm.iadmm.reproduce.algorithm_label`) dotted."""
    algorithm, _, variant = label.partition("-")
    return {"color": COLOURS[algorithm], "ls": ":" if variant else "--" if algorithm == "iadmm" else "-"}


def _curves(rows: list[dict[str, Any]], key: str) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """(dataset, algorithm, eps) -> (rounds, values [seeds, rounds]) of one metric."""
    table: dict[tuple, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        table[(r["dataset"], r["algorithm"], r["eps"])][r["seed"]][r["round"]] = r[key]
    out = {}
    for cell, by_seed in table.items():
        rounds = sorted(set.intersection(*(set(v) for v in by_seed.values())))
        out[cell] = (np.asarray(rounds), np.asarray([[v[t] for t in rounds] for v in by_seed.values()]))
    return out


def _panels(rows: list[dict[str, Any]]) -> tuple[list[str], list[float]]:
    datasets = [d for d in ("mnist", "femnist") if any(r["dataset"] == d for r in rows)]
    eps = sorted({r["eps"] for r in rows if math.isfinite(r["eps"])})
    return datasets, eps


def without_private(rows: list[dict[str, Any]]) -> set[tuple[str, float]]:
    """The panels (data set, eps-bar) of a per-round figure that no private cell fills: a grid's eps-bar
    values make a column for every data set, and a data set run at fewer of them (003's FEMNIST at
    eps-bar 0.05 only, beside MNIST at 0.05 and 5) would otherwise show a panel of the non-private line
    alone, as if its private runs had been left out. Those panels say so instead, and draw nothing."""
    datasets, eps_values = _panels(rows)
    run = {(r["dataset"], r["eps"]) for r in rows}
    return {(d, e) for d in datasets for e in eps_values if (d, e) not in run}


def _per_round(rows: list[dict[str, Any]], key: str, path: Path, ylabel: str, *, band: bool,
               log: bool, private_only: bool) -> None:
    plt = pyplot()
    datasets, eps_values = _panels(rows)
    if not eps_values:
        eps_values = [math.inf]
    curves = _curves(rows, key)
    empty = without_private(rows)
    fig, axes = plt.subplots(len(datasets), len(eps_values), squeeze=False, sharex="row",
                             figsize=(3.2 * len(eps_values) + 0.8, 2.8 * len(datasets) + 0.6))
    for i, dataset in enumerate(datasets):
        for j, eps in enumerate(eps_values):
            ax = axes[i][j]
            if (dataset, eps) in empty:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{dataset.upper()}: no private run\nat eps-bar = {eps:g} in this grid",
                        transform=ax.transAxes, ha="center", va="center", fontsize=9, color="grey")
                continue
            for (d, label, e), (rounds, values) in sorted(curves.items(), key=lambda kv: kv[0][1]):
                non_private = not math.isfinite(e)
                if d != dataset or (private_only and non_private):
                    continue
                if e != eps and not non_private:  # the non-private lines appear in every panel
                    continue
                y = values * (100 if key == "test_error" else 1)
                ax.plot(rounds, y.mean(axis=0), lw=1.2, label=label, **_style(label))
                if band and y.shape[0] > 1:
                    ax.fill_between(rounds, np.percentile(y, 20, axis=0), np.percentile(y, 80, axis=0),
                                    color=_style(label)["color"], alpha=0.2, lw=0)
            if log:
                ax.set_yscale("log")
            ax.set_title(f"{dataset.upper()}, eps-bar = {eps:g}" if math.isfinite(eps) else dataset.upper(),
                         fontsize=9)
            ax.set_xlabel("round t", fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
            if ax.lines:
                ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# final test errors per (dataset, algorithm label, eps), one value per seed
Errors = dict[tuple[str, str, float], list[float]]


def draw_all(rows: list[dict[str, Any]], errors: Errors, out: Path) -> list[Path]:
    """Write the four figures into ``out`` from the rows and the final errors; returns their paths."""
    paths = [out / "fig1-test-error.png", out / "fig2-best-error-vs-eps.png", out / "fig3-noise.png",
             out / "fig5-consensus.png"]
    _per_round(rows, "test_error", paths[0], "test error (%)", band=True, log=False, private_only=False)
    _best_vs_eps(rows, errors, paths[1])
    _per_round(rows, "noise_magnitude", paths[2], "mean |noise|", band=False, log=True, private_only=True)
    _per_round(rows, "consensus_violation", paths[3], "consensus violation", band=False, log=True,
               private_only=False)
    return paths


def _best_vs_eps(rows: list[dict[str, Any]], errors: Errors, path: Path) -> None:
    plt = pyplot()
    datasets, _ = _panels(rows)
    fig, axes = plt.subplots(1, len(datasets), squeeze=False, figsize=(4.2 * len(datasets), 3.2))
    for i, dataset in enumerate(datasets):
        ax = axes[0][i]
        for label in sorted({a for d, a, _ in errors if d == dataset}):
            points = sorted((eps, 100 * min(v)) for (d, a, eps), v in errors.items()
                            if d == dataset and a == label)
            if not math.isfinite(points[0][0]):
                ax.axhline(points[0][1], lw=1, label=f"{label} (non-private)", **_style(label))
            else:
                ax.plot(*zip(*points, strict=True), marker="o", label=label, **_style(label))
        ax.set_xscale("log")
        ax.set_xlabel("eps-bar (per local step)", fontsize=8)
        ax.set_ylabel("best test error (%)", fontsize=8)
        ax.set_title(dataset.upper(), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
