"""004's figures from ``dpadmm reproduce --paper 004``'s files (PNG files a person can open).

``fig-1.png`` (004 Fig. 1): the amplification gamma of Theorem 2.3 against the interval length omega for
several Laplace rates beta, alpha B = 0.001: the exact expectation (solid) and eq. (11) as printed (dotted).

``fig-<figure>.png``: the log-error against iterations, the mean over runs with the best-to-worst band
(left), and for a private figure the cumulative privacy loss per agent (right): each method's a-priori
loss (dashed, the guarantee) and its ex-post loss (solid, the mean over agents and runs; a diagnostic).
"""

from __future__ import annotations

import math
from pathlib import Path

from dpadmm.runs.tables import pyplot


def figure(path: Path, name: str, methods: dict[str, dict[str, list[float]]]) -> None:
    """One figure: log-error bands, and the privacy curves when the methods are private."""
    if not methods:
        return
    private = any(not math.isnan(b["epsilon"][-1]) for b in methods.values())
    plt = pyplot()
    fig, axes = plt.subplots(1, 2 if private else 1, figsize=(10 if private else 5.2, 3.8), squeeze=False)
    colours = plt.get_cmap("tab10")
    for i, (method, band) in enumerate(methods.items()):
        ax = axes[0][0]
        ax.plot(band["round"], band["mean"], color=colours(i), label=method)
        ax.fill_between(band["round"], band["min"], band["max"], color=colours(i), alpha=0.2)
        if private and not math.isnan(band["epsilon"][-1]):
            ax = axes[0][1]
            ax.plot(band["round"], band["epsilon"], color=colours(i), ls="--", label=f"{method}, a priori")
            ax.plot(band["round"], band["epsilon_ex_post"], color=colours(i), label=f"{method}, ex post")
    axes[0][0].set_title(f"Fig. {name}: accuracy", fontsize=10)
    axes[0][0].set_xlabel("iteration")
    axes[0][0].set_ylabel("ln(||x_i - x*|| / d), mean over agents")
    axes[0][0].legend(fontsize=8)
    axes[0][0].grid(alpha=0.3)
    if private:
        axes[0][1].set_title(f"Fig. {name}: privacy loss per agent", fontsize=10)
        axes[0][1].set_xlabel("iteration")
        axes[0][1].set_ylabel("cumulative epsilon")
        axes[0][1].legend(fontsize=7)
        axes[0][1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gamma(path: Path, table: dict[float, dict[float, tuple[float, float]]]) -> None:
    """Fig. 1: gamma against omega, one line per beta (``table[beta][omega] = (exact, eq. (11))``)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    colours = plt.get_cmap("viridis")
    for i, (beta, row) in enumerate(sorted(table.items())):
        omegas = sorted(row)
        colour = colours(i / max(1, len(table) - 1))
        ax.plot(omegas, [row[w][0] for w in omegas], color=colour, label=f"beta = {beta:g}")
        ax.plot(omegas, [row[w][1] for w in omegas], color=colour, ls=":")
    ax.set_xlabel("interval length omega")
    ax.set_ylabel("gamma: expected ex-post / worst case")
    ax.set_title("Fig. 1 (alpha B = 0.001): exact (solid), eq. (11) (dotted)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
