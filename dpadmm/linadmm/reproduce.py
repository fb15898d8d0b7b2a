"""``dpadmm reproduce --paper 002``: Xu et al.'s Fig. 1 and Fig. 2, with the choices the paper leaves open.

The paper (002, Section V) runs ADMM, AccADMM, DP-ADMM and DP-AccADMM on the graph-guided fused
lasso of eq. (11) over a8a, a9a, bio_train and ijcnn1, with delta = 1e-3, mu = 0.5, rho = 1,
gamma = 1 and lambda = 1e-5, and prints no numbers: Fig. 1 plots the objective gap against
running time, Fig. 2 the objective and the test accuracy against eps. It does not give eta, T,
x_0, the eps of Fig. 1, the eps grid of Fig. 2, or how many repetitions. The choices here:

- **eta = 1/L_f** per data set, L_f = ||F||_2^2 / (4 n) (:func:`~dpadmm.linadmm.problem.smoothness`):
  the largest step the paper's utility analysis allows (Lemma 5: eta <= 1/L_f), one constant per
  data set as the paper says ("a constant on each dataset"). ``--eta`` overrides it. Like W, it is
  computed from the training features and the guarantee does not cover it.
- **T from a sweep**: every eps is run at every T of ``--rounds`` (default 25, 50, ..., 400),
  because sigma grows with sqrt(T) (eq. (8)) and the answer to claim 3 depends on T. Fig. 2 is drawn
  at T*, per data set the T with the lowest mean DP-ADMM objective at ``--fig1-eps``; the claim-3
  table gives every T, and each method at its own best T. Choosing T on private runs is, like the
  paper's tuning, outside the guarantee. Fig. 1 runs T = max(rounds).
- x_0 = 0, u_0 = 0 (the private default); eps in 0.01, 0.02, ..., 0.1; Fig. 1 at eps = 0.05;
  5 seeds per private cell (mean and standard deviation); the non-private runs have no noise and
  run once.
- The minimum F* of the objective gap: an independent solver (L-BFGS on a smoothing of eq. (11),
  :func:`~dpadmm.linadmm.problem.reference_optimum`), checked against long non-private ADMM and
  AccADMM runs (``--optimum-rounds``); F* is the lowest of the three.

Everything is appended to CSV files in ``--out`` as it completes (``problems.csv``,
``optimum.csv``, ``cells.csv``, ``curves.csv``), so an interrupted call resumes where it stopped;
``summary.md``, ``fig1-gap-vs-time.png`` and ``fig2-vs-eps.png`` are rebuilt from them.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpadmm.catalog import BINARY_DATASET_NAMES
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.runs import references
from dpadmm.runs.estimate import Estimate, Unit
from dpadmm.runs.estimate import estimate as estimate_units
from dpadmm.runs.tables import Tables, from_args

PAPER = LinAdmmConfig()  # the paper's constants are the family's defaults
PAPER_DATASETS = ("a8a", "a9a", "bio_train", "ijcnn1")  # the panels of 002's Fig. 1, in its order
PAPER_EPS = tuple(round(0.01 * k, 2) for k in range(1, 11))
REFERENCES = ("002",)  # what summary.md cites (dpadmm.runs.references): the paper alone
# (label, algorithm, private): the four lines of 002's figures
METHODS = (("ADMM", "dp-admm", False), ("AccADMM", "dp-accadmm", False),
           ("DP-ADMM", "dp-admm", True), ("DP-AccADMM", "dp-accadmm", True))
GAP_LEVELS = (1e-2, 1e-3)  # claim 2: iterations until the objective gap first falls below these

FILES = {
    "problems": ("dataset", "samples", "features", "edges", "graph_converged", "smoothness", "eta"),
    "optimum": ("dataset", "reference", "admm_long", "accadmm_long", "rounds", "optimum"),
    "cells": ("dataset", "method", "eps", "rounds", "seed", "objective", "objective_avg", "test_accuracy",
              "test_accuracy_avg", "seconds"),
    "curves": ("dataset", "method", "eps", "seed", "round", "elapsed", "objective", "test_accuracy"),
}


@dataclass(frozen=True)
class Grid:
    """What ``dpadmm reproduce --paper 002`` runs; the defaults are the grid of ``docs/results/002``."""

    out: str = "reproduce-002"
    data_dir: str = ""  # a folder with one sub-folder per data set (a9a/, ...); empty: the cache
    datasets: tuple[str, ...] = PAPER_DATASETS
    eps: tuple[float, ...] = PAPER_EPS
    fig1_eps: float = 0.05
    rounds: tuple[int, ...] = (25, 50, 100, 200, 400)
    seeds: int = 5
    eta: float = 0.0  # 0: 1/L_f per data set
    optimum_rounds: int = 5000
    dtype: str = "float64"
    device: str = "cpu"

    def __post_init__(self) -> None:
        bad = [d for d in self.datasets if d not in BINARY_DATASET_NAMES]
        if bad or not self.datasets:
            raise ValueError(f"datasets={','.join(self.datasets)!r} is not allowed; choose among "
                             f"{', '.join(BINARY_DATASET_NAMES)}")
        if not self.eps or any(not (0 < e < math.inf) for e in (*self.eps, self.fig1_eps)):
            raise ValueError(f"eps={self.eps!r} and fig1-eps={self.fig1_eps!r} are not allowed; give finite "
                             "values > 0")
        if not self.rounds or min(self.rounds) < 1 or self.seeds < 1 or self.optimum_rounds < 1:
            raise ValueError(f"rounds={self.rounds!r}, seeds={self.seeds} and optimum-rounds="
                             f"{self.optimum_rounds} must be >= 1")
        if not self.eta >= 0:
            raise ValueError(f"eta={self.eta!r} is not allowed; it must be > 0 (0 = 1/L_f per data set)")
        LinAdmmConfig(dtype=self.dtype, device=self.device)  # the family's own checks and messages

    def config(self, dataset: str, algorithm: str, eps: float, rounds: int, eta: float,
               eval_every: int) -> LinAdmmConfig:
        """A run of the grid: the paper's constants (the family's defaults) and the grid's choices."""
        return LinAdmmConfig(algorithm=algorithm, target_epsilon=eps, rounds=rounds, eta=eta, dataset=dataset,
                             data_dir=_folder(self.data_dir, dataset), dtype=self.dtype,
                             device=self.device, eval_every=eval_every)

    def settings(self) -> dict[str, Any]:
        """What a resumed call must agree on with the one that wrote the folder (not where it reads from)."""
        return {k: v for k, v in asdict(self).items() if k not in ("out", "data_dir", "datasets", "device")}


def grid_from_args(**kwargs: Any) -> Grid:
    """A Grid from command-line values (comma-separated lists as strings)."""
    return from_args(Grid, **kwargs)


# ----- the runs -----


def _folder(root: str, dataset: str) -> str:
    """The data set's folder under ``root``; empty (the loaders' cache, fetched on first use) without one."""
    return str(Path(root) / dataset) if root else ""


def run_grid(grid: Grid, *, progress: bool = True, log: Callable[[str], None] = print) -> Path:
    """Run every missing unit of ``grid`` into ``grid.out`` (resuming), then write the report."""
    out = Path(grid.out)
    Tables(out, FILES).claim(grid.settings())
    for dataset in grid.datasets:
        _run_dataset(grid, out, dataset, progress, log)
        write_report(out)
    write_report(out)
    return out


def estimate(grid: Grid) -> Estimate:
    """The wall time of the units of ``grid`` not yet in ``grid.out``, before any runs: the long non-private
    runs that check the optimum, the cells (T iterations, one evaluation, the seeds batched) and Fig. 1's
    curves (each seed alone, every iteration evaluated). Each kind (data set, algorithm, private or not,
    seeds) runs a few iterations on the loaded data set (:mod:`dpadmm.runs.estimate`); the loading is
    timed and counted once per data set, as the grid loads each once."""
    from dpadmm.linadmm import engine, problem

    if not grid.data_dir:
        raise ValueError("--data-dir is needed: a folder with one sub-folder per data set, e.g. "
                         "../shared/data (a9a/a9a.gz, bio_train/bio_train.dat.gz, ...)")
    tables = Tables(Path(grid.out), FILES)
    units: list[Unit] = []
    loading = 0.0
    t_max = max(grid.rounds)
    for dataset in grid.datasets:
        wanted: list[tuple[str, bool, int, int, int]] = []  # algorithm, private, seeds, iterations, evals
        if dataset not in {r["dataset"] for r in tables.read("optimum")}:
            wanted += [(alg, False, 1, grid.optimum_rounds, 1) for alg in ("dp-admm", "dp-accadmm")]
        done = {(r["method"], float(r["eps"]), int(r["rounds"])) for r in tables.read("cells")
                if r["dataset"] == dataset}
        wanted += [(algorithm, private, grid.seeds if private else 1, rounds, 1)
                   for rounds in grid.rounds for label, algorithm, private in METHODS
                   for eps in (grid.eps if private else (math.inf,)) if (label, eps, rounds) not in done]
        drawn = {(r["method"], int(r["seed"])) for r in tables.read("curves") if r["dataset"] == dataset}
        wanted += [(algorithm, private, 1, t_max, t_max) for label, algorithm, private in METHODS
                   for seed in (range(grid.seeds) if private else range(1)) if (label, seed) not in drawn]
        if not wanted:
            continue
        began = time.perf_counter()
        task = problem.load(dataset, str(Path(grid.data_dir) / dataset), PAPER.graph_alpha,
                            engine.DTYPES[grid.dtype], grid.device)
        loading += time.perf_counter() - began
        for algorithm, private, seeds, iterations, evaluated in wanted:

            def run(k: int, dataset: str = dataset, algorithm: str = algorithm, private: bool = private,
                    seeds: int = seeds, task: Any = task) -> list[dict[str, Any]]:
                config = grid.config(dataset, algorithm, grid.fig1_eps if private else math.inf, k,
                                     grid.eta or 1.0, 1)
                return engine.run(config, range(seeds), problem=task, write=False, progress=False).records[0]

            units.append(Unit(key=(dataset, algorithm, private, seeds), iterations=iterations,
                              evaluations=evaluated, probe=run))
    excluded = "the reference solver of each data set whose optimum is not yet in --out"
    found = estimate_units(units, excluded=excluded)
    return dataclasses.replace(found, seconds=found.seconds + loading)


@dataclass(frozen=True)
class _Runner:
    """Runs of one data set: the grid's settings, the loaded problem and its eta."""

    grid: Grid
    dataset: str
    task: Any  # dpadmm.linadmm.problem.Problem (torch is imported only when the grid runs)
    eta: float
    progress: bool

    def records(self, algorithm: str, eps: float, rounds: int, seeds: Sequence[int], every: int,
                ) -> list[list[dict[str, Any]]]:
        from dpadmm.linadmm import engine

        config = self.grid.config(self.dataset, algorithm, eps, rounds, self.eta, every)
        return engine.run(config, seeds, problem=self.task, write=False, progress=self.progress).records


def _run_dataset(grid: Grid, out: Path, dataset: str, progress: bool, log: Callable[[str], None]) -> None:
    from dpadmm.linadmm import engine, problem

    tables = Tables(out, FILES)

    task = problem.load(dataset, _folder(grid.data_dir, dataset), PAPER.graph_alpha,
                        engine.DTYPES[grid.dtype], grid.device)
    if dataset not in {r["dataset"] for r in tables.read("problems")}:
        lf = problem.smoothness(task.features)
        tables.append("problems", [{
            "dataset": dataset, "samples": task.num_samples, "features": task.num_features,
            "edges": len(task.edges), "graph_converged": task.graph_converged, "smoothness": lf,
            "eta": grid.eta or 1 / lf}])
    eta = next(float(r["eta"]) for r in tables.read("problems") if r["dataset"] == dataset)
    runner = _Runner(grid, dataset, task, eta, progress)
    if dataset not in {r["dataset"] for r in tables.read("optimum")}:
        log(f"{dataset}: the optimum (the reference solver, and {grid.optimum_rounds} non-private "
            "iterations of ADMM and of AccADMM)")
        reference = problem.reference_optimum(task, PAPER.l1)[0]
        long = [runner.records(alg, math.inf, grid.optimum_rounds, [0], grid.optimum_rounds)[0][-1]
                ["objective"] for alg in ("dp-admm", "dp-accadmm")]
        tables.append("optimum", [{"dataset": dataset, "reference": reference, "admm_long": long[0],
                                  "accadmm_long": long[1], "rounds": grid.optimum_rounds,
                                  "optimum": min(reference, *long)}])
    done = {(r["method"], float(r["eps"]), int(r["rounds"])) for r in tables.read("cells")
            if r["dataset"] == dataset}
    for rounds in grid.rounds:
        for label, algorithm, private in METHODS:
            for eps in grid.eps if private else (math.inf,):
                if (label, eps, rounds) in done:
                    continue
                seeds = range(grid.seeds) if private else range(1)
                log(f"{dataset}: {label} eps={eps:g} T={rounds}")
                runs = runner.records(algorithm, eps, rounds, seeds, rounds)
                tables.append("cells", [{
                    "dataset": dataset, "method": label, "eps": eps, "rounds": rounds, "seed": seed,
                    "objective": r[-1]["objective"], "objective_avg": r[-1]["objective-avg"],
                    "test_accuracy": r[-1]["test-accuracy"],
                    "test_accuracy_avg": r[-1]["test-accuracy-avg"], "seconds": r[-1]["elapsed"]}
                    for seed, r in zip(seeds, runs, strict=True)])
    drawn = {(r["method"], int(r["seed"])) for r in tables.read("curves") if r["dataset"] == dataset}
    t_max = max(grid.rounds)
    for label, algorithm, private in METHODS:  # Fig. 1: each run alone, so that its clock is one run's
        eps = grid.fig1_eps if private else math.inf
        for seed in range(grid.seeds) if private else range(1):
            if (label, seed) in drawn:
                continue
            log(f"{dataset}: Fig. 1, {label} seed {seed}, T={t_max}")
            curve = runner.records(algorithm, eps, t_max, [seed], 1)[0]
            tables.append("curves", [{"dataset": dataset, "method": label, "eps": eps, "seed": seed,
                                     "round": r["round"], "elapsed": r["elapsed"],
                                     "objective": r["objective"], "test_accuracy": r["test-accuracy"]}
                                    for r in curve])


# ----- the report -----


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


Table = dict[tuple[str, str, float, int], dict[str, tuple[float, float]]]


def finals(rows: Iterable[dict[str, str]]) -> Table:
    """(dataset, method, eps, T) -> {objective, test_accuracy, ...: (mean, std over seeds)}."""
    grouped: dict[tuple[str, str, float, int], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        grouped[(r["dataset"], r["method"], float(r["eps"]), int(r["rounds"]))].append(r)
    return {key: {name: _mean_std([float(r[name]) for r in group])
                  for name in ("objective", "objective_avg", "test_accuracy", "test_accuracy_avg", "seconds")}
            for key, group in grouped.items()}


def best_rounds(table: Table, dataset: str, eps: float) -> int | None:
    """T*: the T with the lowest mean DP-ADMM objective at ``eps`` (None if no such cell)."""
    options = [(v["objective"][0], t) for (d, m, e, t), v in table.items()
               if d == dataset and m == "DP-ADMM" and e == eps]
    return min(options)[1] if options else None


def crossover(table: Table, dataset: str, rounds: int, metric: str) -> tuple[float | None, bool]:
    """(the smallest eps of the grid from which DP-AccADMM is better than DP-ADMM at every larger eps, or
    None; whether DP-ADMM is better at the smallest eps): claim 3 holds where both are true."""
    sign = -1 if metric == "objective" else 1  # lower objective, higher accuracy is better
    grid = sorted(e for (d, m, e, t) in table if d == dataset and t == rounds and m == "DP-ADMM")
    better = [sign * (table[(dataset, "DP-AccADMM", e, rounds)][metric][0]
                      - table[(dataset, "DP-ADMM", e, rounds)][metric][0]) > 0
              for e in grid if (dataset, "DP-AccADMM", e, rounds) in table]
    if len(better) != len(grid) or not grid:
        return None, False
    start = None
    for i in range(len(grid) - 1, -1, -1):
        if not better[i]:
            break
        start = grid[i]
    return start, not better[0]


TUNED = 0  # the T of a tuned() table's cells


def tuned(table: Table, metric: str) -> Table:
    """The table with every (data set, method, eps) at the T of the grid with the best mean ``metric``
    (lowest objective, highest accuracy), as T = :data:`TUNED`."""
    best: Table = {}
    sign = 1 if metric == "objective" else -1
    for (d, m, e, _), values in sorted(table.items()):
        key = (d, m, e, TUNED)
        if key not in best or sign * values[metric][0] < sign * best[key][metric][0]:
            best[key] = values
    return best


def mean_curves(rows: Iterable[dict[str, str]]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(dataset, method) -> round, elapsed and objective, each the mean over the seeds at that round."""
    grouped: dict[tuple[str, str, int], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        grouped[(r["dataset"], r["method"], int(r["round"]))].append(r)
    curves: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (dataset, method, t), group in sorted(grouped.items()):
        curve = curves[(dataset, method)]
        curve["round"].append(t)
        for name in ("elapsed", "objective", "test_accuracy"):
            curve[name].append(statistics.fmean(float(r[name]) for r in group))
    return curves


def first_below(curve: dict[str, list[float]], optimum: float, level: float) -> int | None:
    """The first iteration whose mean objective gap is below ``level`` (None if none is)."""
    pairs = zip(curve["round"], curve["objective"], strict=True)
    return next((t for t, f in pairs if f - optimum < level), None)


def write_report(out: Path) -> None:
    """summary.md and the two figures from the CSV files in ``out``."""
    from dpadmm.linadmm import figures

    tables = Tables(out, FILES)

    problems = {r["dataset"]: r for r in tables.read("problems")}
    optimum = {r["dataset"]: r for r in tables.read("optimum")}
    table = finals(tables.read("cells"))
    curves = mean_curves(tables.read("curves"))
    settings = tables.settings()
    figures.fig1(out / "fig1-gap-vs-time.png", curves, {d: float(r["optimum"]) for d, r in optimum.items()},
                 settings["fig1_eps"])
    chosen = {d: best_rounds(table, d, settings["fig1_eps"]) for d in problems}
    figures.fig2(out / "fig2-vs-eps.png", table, chosen)
    (out / "summary.md").write_text(summary(settings, problems, optimum, table, curves, chosen),
                                    encoding="utf-8")


def _fmt(value: tuple[float, float], digits: int = 4) -> str:
    return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"


def summary(settings: dict[str, Any], problems: dict[str, dict[str, str]], optimum: dict[str, dict[str, str]],
            table: Table, curves: dict, chosen: dict[str, int | None]) -> str:
    """The report: settings, the problems, the optimum check, Fig. 1 and 2 in numbers, the paper's claims."""
    eps1 = settings["fig1_eps"]
    t_max = max(settings["rounds"])
    lines = [
        "# Paper 002 reproduced: DP-ADMM and DP-AccADMM (Xu et al.)",
        "",
        "Written by `dpadmm reproduce --paper 002`; the numbers below are computed from the CSV files beside "
        "this one. Settings: delta = 1e-3, mu = 0.5, rho = 1, gamma = 1, lambda = 1e-5 (the paper's); "
        f"x_0 = 0, u_0 = 0; eta = {'1/L_f per data set' if not settings['eta'] else settings['eta']}; "
        f"T in {', '.join(map(str, settings['rounds']))}; {settings['seeds']} seeds per private cell "
        f"(mean ± std); {settings['dtype']}. Why these, in `dpadmm/linadmm/reproduce.py`.",
        "",
        "## The problems",
        "",
        "| data | n | d | edges of W | graphical lasso converged | L_f | eta |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d, r in problems.items():
        lines.append(f"| {d} | {r['samples']} | {r['features']} | {r['edges']} | {r['graph_converged']} | "
                     f"{float(r['smoothness']):.4g} | {float(r['eta']):.4g} |")
    lines += ["", "## The minimum F* of eq. (11)", "",
              "| data | reference solver | ADMM, long | AccADMM (as printed), long | iterations | "
              "F* - reference |",
              "| --- | --- | --- | --- | --- | --- |"]
    for d, r in optimum.items():
        lines.append(f"| {d} | {float(r['reference']):.8f} | {float(r['admm_long']):.8f} | "
                     f"{float(r['accadmm_long']):.8f} | {r['rounds']} | "
                     f"{float(r['optimum']) - float(r['reference']):.2e} |")
    lines += ["", f"## Fig. 1: objective gap against time (eps = {eps1:g} for the private runs, T = {t_max})",
              "", "![Fig. 1](fig1-gap-vs-time.png)", "",
              "Iterations until the mean objective gap first falls below "
              + " and ".join(f"{g:g}" for g in GAP_LEVELS) + f" (— : not within {t_max}), the final gap and "
              "the time per iteration of one run:", "",
              "| data | method | " + " | ".join(f"gap < {g:g}" for g in GAP_LEVELS)
              + " | final gap | ms per iteration |",
              "| --- | --- | " + " | ".join("---" for _ in GAP_LEVELS) + " | --- | --- |"]
    for d in problems:
        f_star = float(optimum[d]["optimum"]) if d in optimum else math.nan
        for label, _, _ in METHODS:
            curve = curves.get((d, label))
            if not curve:
                continue
            hits = [first_below(curve, f_star, g) for g in GAP_LEVELS]
            per = 1e3 * curve["elapsed"][-1] / curve["round"][-1]
            lines.append(f"| {d} | {label} | " + " | ".join("—" if h is None else str(h) for h in hits)
                         + f" | {curve['objective'][-1] - f_star:.3g} | {per:.2f} |")
    lines += ["", "## Fig. 2: objective and test accuracy against eps (last iterate, at T*)", "",
              "![Fig. 2](fig2-vs-eps.png)", "",
              f"T* per data set: the T with the lowest mean DP-ADMM objective at eps = {eps1:g}: "
              + ", ".join(f"{d} {t}" for d, t in chosen.items()) + ".", ""]
    for d, t in chosen.items():
        if t is None:
            continue
        reference = {label: table.get((d, label, math.inf, t)) for label in ("ADMM", "AccADMM")}
        lines += [f"**{d}** (T* = {t}; non-private: ADMM "
                  + ", AccADMM ".join(f"{v['objective'][0]:.4f} / {v['test_accuracy'][0]:.4f}"
                                      for v in reference.values() if v) + ")", "",
                  "| eps | DP-ADMM objective | DP-AccADMM objective | DP-ADMM accuracy | "
                  "DP-AccADMM accuracy |",
                  "| --- | --- | --- | --- | --- |"]
        for eps in sorted(e for (dd, m, e, tt) in table if dd == d and tt == t and m == "DP-ADMM"):
            admm, acc = table[(d, "DP-ADMM", eps, t)], table.get((d, "DP-AccADMM", eps, t))
            if acc is None:
                continue
            lines.append(f"| {eps:g} | {_fmt(admm['objective'])} | {_fmt(acc['objective'])} | "
                         f"{_fmt(admm['test_accuracy'])} | {_fmt(acc['test_accuracy'])} |")
        lines.append("")
    lines += [f"## The choice of T: final objective at eps = {eps1:g} against T", "",
              "Mean over seeds (last iterate). sigma grows with sqrt(T) (eq. (8)), so a longer run is not a "
              "better one; AccADMM's momentum carries the noise of every earlier step.", "",
              "| data | method | " + " | ".join(f"T = {t}" for t in settings["rounds"]) + " |",
              "| --- | --- | " + " | ".join("---" for _ in settings["rounds"]) + " |"]
    for d in problems:
        for label, _, private in METHODS:
            eps = eps1 if private else math.inf
            values = [table.get((d, label, eps, t)) for t in settings["rounds"]]
            lines.append(f"| {d} | {label} | " + " | ".join("" if v is None else f"{v['objective'][0]:.4g}"
                                                           for v in values) + " |")
    lines += ["", "## Claim 3: where DP-AccADMM overtakes DP-ADMM", "",
              "The smallest eps of the grid from which DP-AccADMM's mean is better than DP-ADMM's at every "
              "larger eps (— : at no eps up to the largest), and whether DP-ADMM is better at the smallest "
              "eps; the claim (002: about 0.07-0.08) holds where there is such an eps and DP-ADMM leads "
              "below it.",
              "", "| data | T | objective: from eps | below it DP-ADMM better | accuracy: from eps | "
              "below it DP-ADMM better |", "| --- | --- | --- | --- | --- | --- |"]
    for d in problems:
        for t in (*settings["rounds"], TUNED):
            cells = []
            for metric in ("objective", "test_accuracy"):
                start, below = crossover(tuned(table, metric) if t == TUNED else table, d, t, metric)
                cells += ["—" if start is None else f"{start:g}", "yes" if below else "no"]
            lines.append(f"| {d} | {t if t != TUNED else 'each its best'} | " + " | ".join(cells) + " |")
    lines += ["", "*each its best*: each method at each eps with the T of the grid that is best for it in "
              "that column (the most favourable tuning for both).", "", *references.section(REFERENCES), ""]
    return "\n".join(lines)
