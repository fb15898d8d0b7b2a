"""002's figures from ``dpadmm reproduce --paper 002``'s files (PNG files a person can open).

- ``fig1-gap-vs-time.png`` (002 Fig. 1): the objective gap F(x_t) - F* against the running time of
  one run, log scale, one panel per data set, one line per method (mean over seeds). The paper's
  caption swaps the axes; its text ("as the number of iterations increases") and its plots do not.
- ``fig2-vs-eps.png`` (002 Fig. 2): the final objective (top row) and test accuracy (bottom row)
  against eps at T*, mean and standard deviation over seeds, the non-private runs as dashed lines.
"""

from __future__ import annotations

import math
from pathlib import Path

from dpadmm.runs.tables import pyplot

COLOURS = {"ADMM": "tab:blue", "AccADMM": "tab:red", "DP-ADMM": "tab:blue", "DP-AccADMM": "tab:red"}


def _style(method: str) -> dict[str, str]:
    """The private method in the colour of its counterpart, solid; the non-private one dashed."""
    return {"color": COLOURS[method], "ls": "-" if method.startswith("DP-") else "--"}


def fig1(path: Path, curves: dict, optimum: dict[str, float], eps: float) -> None:
    """One panel per data set: objective gap against seconds, log y."""
    datasets = [d for d in optimum if any(key[0] == d for key in curves)]
    if not datasets:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.4), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        for (d, method), curve in sorted(curves.items()):
            if d != dataset:
                continue
            gaps = [max(f - optimum[d], 1e-12) for f in curve["objective"]]
            ax.plot(curve["elapsed"], gaps, label=method, **_style(method))
        ax.set_yscale("log")
        ax.set_title(dataset)
        ax.set_xlabel("running time of one run (s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("objective minus minimum")
    axes[0][0].legend(fontsize=8, title=f"private: eps = {eps:g}", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig2(path: Path, table: dict, chosen: dict[str, int | None]) -> None:
    """Top: objective against eps; bottom: test accuracy; one column per data set, at its T*."""
    datasets = [d for d, t in chosen.items() if t is not None]
    if not datasets:
        return
    plt = pyplot()
    fig, axes = plt.subplots(2, len(datasets), figsize=(4.2 * len(datasets), 6.4), squeeze=False)
    for column, dataset in enumerate(datasets):
        rounds = chosen[dataset]
        for row, metric in enumerate(("objective", "test_accuracy")):
            ax = axes[row][column]
            for method in ("DP-ADMM", "DP-AccADMM"):
                points = sorted((e, v[metric]) for (d, m, e, t), v in table.items()
                                if d == dataset and m == method and t == rounds)
                if points:
                    ax.errorbar([e for e, _ in points], [v[0] for _, v in points],
                                yerr=[v[1] for _, v in points], label=method, capsize=2, marker="o",
                                markersize=3, **_style(method))
            for method in ("ADMM", "AccADMM"):
                value = table.get((dataset, method, math.inf, rounds))
                if value:
                    ax.axhline(value[metric][0], label=method, lw=1, **_style(method))
            ax.set_xlabel("eps (whole run, delta = 1e-3)")
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(f"{dataset} (T = {rounds})")
                ax.set_yscale("log")
        axes[0][column].set_ylabel("objective" if column == 0 else "")
        axes[1][column].set_ylabel("test accuracy" if column == 0 else "")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
