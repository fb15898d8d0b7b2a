"""001's figures from ``dpadmm reproduce --paper 001``'s files (PNG files a person can open).

- ``fig1-a9a.png`` and ``fig2-mnist-4v9.png`` (001 Figs. 1 and 2, gisette's replaced by its stand-in):
  the training objective (left) and test log loss (right) against epochs; the top row ADMM sharing
  against vertical SGD without noise, the scikit-learn optimum dashed; the rows below ADMM under
  each noise level, one row per noise mode (mean over seeds).
- ``fig3-noise.png`` (001 Fig. 3): the final test log loss against the noise level sigma, both modes
  (mean and standard deviation over seeds), beside the two centralised baselines as lines.
"""

from __future__ import annotations

from pathlib import Path

from dpadmm.runs.tables import pyplot

MODES = {"paper": "paper noise (eq. (16), not covered)", "message": "message noise (Gaussian mechanism)"}
CEILING = 1.0  # the y-axis of a log-loss panel stops here: a ruined model's loss is off the chart


def epochs(path: Path, dataset: str, curves: dict, steps: tuple[float | None, float | None], base: dict
           ) -> None:
    """Training objective and test log loss against epochs: no noise (ADMM at its rho, SGD at its rate),
    then each noise mode."""
    rho, rate = steps
    admm = curves.get((dataset, "ADMM", "none", 0.0, rho or 0.0))
    if not admm:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1 + len(MODES), 2, figsize=(9, 3.1 * (1 + len(MODES))), squeeze=False)
    optimum = base.get((dataset, "all features"))
    for column, metric in enumerate(("train_objective", "test_log_loss")):
        ax = axes[0][column]
        ax.plot(admm["epoch"], admm[metric], label=f"ADMM sharing (rho {rho:g}/(4N))", color="tab:blue")
        sgd = curves.get((dataset, "SGD", "none", 0.0, rate or 0.0))
        if sgd:
            ax.plot(sgd["epoch"], sgd[metric], label=f"vertical SGD (rate {rate:g})", color="tab:red")
        if optimum:
            ax.axhline(float(optimum[metric]), color="black", ls="--", lw=1,
                       label="scikit-learn, all features")
        for row, noise in enumerate(MODES, start=1):
            ax = axes[row][column]
            levels = sorted(key[3] for key in curves if key[:3] == (dataset, "ADMM", noise))
            colours = plt.get_cmap("viridis")
            for i, sigma in enumerate(levels):
                curve = next(c for key, c in curves.items() if key[:4] == (dataset, "ADMM", noise, sigma))
                ax.plot(curve["epoch"], curve[metric], color=colours(i / max(1, len(levels) - 1)),
                        label=f"sigma {sigma:.3g}")
            ax.plot(admm["epoch"], admm[metric], color="tab:blue", ls=":", label="no noise")
            ax.set_title(MODES[noise], fontsize=9)
    for row in axes:
        for column, ax in enumerate(row):
            low = min((min(line.get_ydata()) for line in ax.get_lines()), default=0.0)
            ax.set_ylim(max(0.0, low - 0.02), CEILING)
            ax.set_xlabel("epoch")
            ax.set_ylabel(("training objective", "test log loss")[column])
            ax.grid(alpha=0.3)
    axes[0][0].set_title(f"{dataset}: no noise", fontsize=9)
    axes[0][1].legend(fontsize=7)
    for row in axes[1:]:
        row[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def noise(path: Path, datasets: list[str], curves: dict, base: dict) -> None:
    """One panel per data set: final test log loss against sigma (log x), the baselines as lines."""
    shown = [d for d in datasets if any(key[:2] == (d, "ADMM") and key[2] != "none" for key in curves)]
    if not shown:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, len(shown), figsize=(4.6 * len(shown), 3.6), squeeze=False)
    for ax, dataset in zip(axes[0], shown, strict=True):
        for noise_mode, colour in zip(MODES, ("tab:green", "tab:purple"), strict=True):
            points = sorted((key[3], c) for key, c in curves.items()
                            if key[:3] == (dataset, "ADMM", noise_mode))
            finals = [(s, c["test_log_loss"][-1], c["test_log_loss_std"][-1]) for s, c in points]
            ax.errorbar([s for s, _, _ in finals], [min(v, CEILING) for _, v, _ in finals],
                        yerr=[e if v < CEILING else 0.0 for _, v, e in finals], marker="o", markersize=3,
                        capsize=2, color=colour, label=MODES[noise_mode])
        for (model, style) in (("all features", "--"), ("party 1 alone", ":")):
            value = base.get((dataset, model))
            if value:
                ax.axhline(float(value["test_log_loss"]), color="black", ls=style, lw=1,
                           label=f"scikit-learn, {model}")
        ax.set_xscale("log")
        ax.set_ylim(0.0, CEILING * 1.02)
        ax.set_title(dataset)
        ax.set_xlabel("noise level sigma (message units)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"final test log loss (at most {CEILING:g} shown)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

