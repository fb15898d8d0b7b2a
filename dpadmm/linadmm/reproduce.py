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

The grid is a list of cells (:mod:`dpadmm.runs.grid`: one after another in this process, or N at once
on Ray workers or a Ray cluster), in two stages, because every run needs eta and eta is the problem's:

1. per data set, ``<data> problem``: the data loaded, W built, L_f and eta (its row of ``problems.csv``);
2. per data set whose problem is there, in this order: ``<data> optimum T=<optimum-rounds>`` (the
   reference solver and the two long runs: its row of ``optimum.csv``); one cell per (T, method, eps),
   e.g. ``a9a DP-ADMM eps=0.05 T=25`` or ``a9a ADMM T=25``, its seeds one batch of the engine (a row of
   ``cells.csv`` per seed); one per run of Fig. 1, e.g. ``a9a Fig. 1 DP-ADMM eps=0.05 seed=3 T=400`` (a
   row of ``curves.csv`` per iteration).

A cell loads its data set itself (once per process, so that a worker with many cells reads it once) and
returns its rows; it writes nothing, as a worker may share no file system with ``--out``. The driver
appends the rows to the CSV files in the grid's order whatever order the cells finish in, so the files
are the same however the grid ran, and rebuilds ``summary.md``, ``fig1-gap-vs-time.png`` and
``fig2-vs-eps.png`` after each data set's last cell and at the end. A cell whose rows are in the files
is skipped: an interrupted call resumes where it stopped, losing at most the cells that were running.
"""

from __future__ import annotations

import dataclasses
import functools
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
from dpadmm.runs.grid import Cell, GridOptions, GridRunner, Workspace
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
        if not 0 <= self.eta < math.inf:
            raise ValueError(f"eta={self.eta!r} is not allowed; it must be finite and > 0 (0 = 1/L_f per "
                             "data set)")
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


def run_grid(grid: Grid, options: GridOptions | None = None, *, log: Callable[[str], None] = print) -> Path:
    """Run every cell of ``grid`` not yet in ``grid.out`` (:mod:`dpadmm.runs.grid`: here, or on Ray with
    ``options``) and write the report; returns the folder.

    Two stages, because the runs need eta and eta is the problem's: stage 1 sets up each data set
    (``problems.csv``), stage 2 runs the optimum, the (T, method, eps) cells and the Fig. 1 curves of every
    data set whose set-up completed. Raises :class:`dpadmm.runs.grid.CellsFailed` at the end if cells failed
    (the others are in the tables and the report; the next call runs the failed ones again)."""
    out = Path(grid.out)
    tables = Tables(out, FILES)
    tables.claim(grid.settings())
    log(f"reproduce --paper 002: {', '.join(grid.datasets)}; T in {', '.join(map(str, grid.rounds))}, "
        f"{len(grid.eps)} eps x {grid.seeds} seeds per private method, {grid.dtype} on {grid.device}, "
        f"into {out}")
    with GridRunner(out, options or GridOptions(), log=log) as runner:
        runner.run([_problem_cell(grid, tables, dataset) for dataset in grid.datasets], _Commit(out))
        # the runs take eta as problems.csv holds it (9 digits), on a first call as on a resumed one
        etas = {r["dataset"]: float(r["eta"]) for r in tables.read("problems")}
        groups = [_dataset_cells(grid, tables, dataset, etas[dataset])
                  for dataset in grid.datasets if dataset in etas]
        pending = [[cell for cell in group if not cell.done] for group in groups]
        last = frozenset(cells[-1].key for cells in pending if cells)  # the report after each data set
        runner.run([cell for group in groups for cell in group], _Commit(out, last))
    write_report(out)
    runner.raise_failures()
    return out


def estimate(grid: Grid) -> Estimate:
    """The wall time of the units of ``grid`` not yet in ``grid.out``, before any runs: the long non-private
    runs that check the optimum, the cells (T iterations, one evaluation, the seeds batched) and Fig. 1's
    curves (each seed alone, every iteration evaluated). Each kind (data set, algorithm, private or not,
    seeds) runs a few iterations on the loaded data set (:mod:`dpadmm.runs.estimate`); the loading is
    timed and counted once per data set, as the grid loads each once (per worker process)."""
    from dpadmm.linadmm import engine

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
        task = _task(dataset, grid.data_dir, grid.dtype, grid.device)
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


# ----- the cells: built by the driver, run wherever the grid runs them -----

ALGORITHMS = {label: (algorithm, private) for label, algorithm, private in METHODS}


def _eps_key(eps: float) -> str:
    """`` eps=0.05`` in a private cell's key, nothing in a non-private one's (eps = inf)."""
    return f" eps={eps:g}" if math.isfinite(eps) else ""


def _problem_cell(grid: Grid, tables: Tables, dataset: str) -> Cell:
    """Stage 1: the data set's row of problems.csv (its graph, L_f and eta); done when the row is there."""
    done = dataset in {r["dataset"] for r in tables.read("problems")}
    return Cell(key=f"{dataset} problem", run=functools.partial(_problem, grid, dataset), done=done)


def _dataset_cells(grid: Grid, tables: Tables, dataset: str, eta: float) -> list[Cell]:
    """Stage 2 of one data set, in the order its rows are appended: the optimum, the cells of the claim-3
    table (T, method, eps; the seeds of a private cell batched), the Fig. 1 curves (each seed alone, so that
    its clock is one run's). A cell is done when its rows are in the tables."""
    optimum = dataset in {r["dataset"] for r in tables.read("optimum")}
    cells = [Cell(key=f"{dataset} optimum T={grid.optimum_rounds}",
                  run=functools.partial(_optimum, grid, dataset, eta), done=optimum)]
    done = {(r["method"], float(r["eps"]), int(r["rounds"])) for r in tables.read("cells")
            if r["dataset"] == dataset}
    for rounds in grid.rounds:
        for label, _, private in METHODS:
            for eps in grid.eps if private else (math.inf,):
                cells.append(Cell(key=f"{dataset} {label}{_eps_key(eps)} T={rounds}",
                                  run=functools.partial(_final, grid, dataset, eta, label, eps, rounds),
                                  done=(label, eps, rounds) in done))
    drawn = {(r["method"], int(r["seed"])) for r in tables.read("curves") if r["dataset"] == dataset}
    t_max = max(grid.rounds)
    for label, _, private in METHODS:
        eps = grid.fig1_eps if private else math.inf
        for seed in range(grid.seeds) if private else range(1):
            which = f" seed={seed}" if private else ""
            cells.append(Cell(key=f"{dataset} Fig. 1 {label}{_eps_key(eps)}{which} T={t_max}",
                              run=functools.partial(_curve, grid, dataset, eta, label, seed),
                              done=(label, seed) in drawn))
    return cells


Rows = dict[str, list[dict[str, Any]]]  # a cell's result: table name -> its rows


@dataclass(frozen=True)
class _Commit:
    """The driver's side of a cell: its rows appended to their tables, in the grid's order whatever order
    the cells finished in (so the files are the same however the grid ran), and the report rebuilt after
    the last pending cell of each data set (``report_after``), as before the grid runner: drawing the two
    figures takes about a second, which after each of a data set's hundred-odd cells would add minutes."""

    out: Path
    report_after: frozenset[str] = frozenset()

    def __call__(self, cell: Cell, result: Rows) -> None:
        Tables(self.out, FILES).append_all(result)
        if cell.key in self.report_after:
            write_report(self.out)


@functools.lru_cache(maxsize=2)
def _task(dataset: str, data_dir: str, dtype: str, device: str) -> Any:
    """The data set's problem (dpadmm.linadmm.problem.Problem), loaded once per process: a worker runs many
    cells of a data set one after another, and reading it and building A takes seconds (the graph itself
    comes from the disk cache, :func:`dpadmm.linadmm.problem.sparse_graph`, written atomically, so workers
    that compute the same graph at once each write a whole file). Two data sets are kept, as the grid's
    order moves from one to the next."""
    from dpadmm.linadmm import engine, problem

    return problem.load(dataset, _folder(data_dir, dataset), PAPER.graph_alpha, engine.DTYPES[dtype], device)


def _grid_task(grid: Grid, dataset: str) -> Any:
    return _task(dataset, grid.data_dir, grid.dtype, grid.device)


def _records(grid: Grid, dataset: str, eta: float, algorithm: str, eps: float, rounds: int,
             seeds: Sequence[int], every: int) -> list[list[dict[str, Any]]]:
    """The records of one engine run of the grid (the seeds as one batch), every ``every``-th evaluated."""
    from dpadmm.linadmm import engine

    config = grid.config(dataset, algorithm, eps, rounds, eta, every)
    return engine.run(config, seeds, problem=_grid_task(grid, dataset), write=False, progress=False).records


def _problem(grid: Grid, dataset: str, workspace: Workspace) -> Rows:
    """Cell: the problem's size, its graph and L_f, and eta (1/L_f unless the grid sets it). The cell
    writes no files (``workspace`` unused): its row goes back to the driver."""
    from dpadmm.linadmm import problem

    task = _grid_task(grid, dataset)
    lf = problem.smoothness(task.features)
    return {"problems": [{"dataset": dataset, "samples": task.num_samples, "features": task.num_features,
                          "edges": len(task.edges), "graph_converged": task.graph_converged,
                          "smoothness": lf, "eta": grid.eta or 1 / lf}]}


def _optimum(grid: Grid, dataset: str, eta: float, workspace: Workspace) -> Rows:
    """Cell: F*, the lowest of the reference solver's value and of ``optimum_rounds`` non-private
    iterations of ADMM and of AccADMM (which check it)."""
    from dpadmm.linadmm import problem

    reference = problem.reference_optimum(_grid_task(grid, dataset), PAPER.l1)[0]
    long = [_records(grid, dataset, eta, algorithm, math.inf, grid.optimum_rounds, [0], grid.optimum_rounds)
            [0][-1]["objective"] for algorithm in ("dp-admm", "dp-accadmm")]
    return {"optimum": [{"dataset": dataset, "reference": reference, "admm_long": long[0],
                         "accadmm_long": long[1], "rounds": grid.optimum_rounds,
                         "optimum": min(reference, *long)}]}


def _final(grid: Grid, dataset: str, eta: float, label: str, eps: float, rounds: int,
           workspace: Workspace) -> Rows:
    """Cell: the last iterate of T = ``rounds`` iterations of one method at one eps, per seed (one run
    without noise for a non-private method, whose runs would not depend on the seed)."""
    algorithm, private = ALGORITHMS[label]
    seeds = range(grid.seeds) if private else range(1)
    runs = _records(grid, dataset, eta, algorithm, eps, rounds, seeds, rounds)
    return {"cells": [{"dataset": dataset, "method": label, "eps": eps, "rounds": rounds, "seed": seed,
                       "objective": r[-1]["objective"], "objective_avg": r[-1]["objective-avg"],
                       "test_accuracy": r[-1]["test-accuracy"],
                       "test_accuracy_avg": r[-1]["test-accuracy-avg"], "seconds": r[-1]["elapsed"]}
                      for seed, r in zip(seeds, runs, strict=True)]}


def _curve(grid: Grid, dataset: str, eta: float, label: str, seed: int, workspace: Workspace) -> Rows:
    """Cell: one run of Fig. 1 (T = max(rounds), eps = fig1_eps for a private method), every iteration
    evaluated; alone, so that its clock is one run's."""
    algorithm, private = ALGORITHMS[label]
    eps = grid.fig1_eps if private else math.inf
    t_max = max(grid.rounds)
    curve = _records(grid, dataset, eta, algorithm, eps, t_max, [seed], 1)[0]
    return {"curves": [{"dataset": dataset, "method": label, "eps": eps, "seed": seed, "round": r["round"],
                        "elapsed": r["elapsed"], "objective": r["objective"],
                        "test_accuracy": r["test-accuracy"]} for r in curve]}


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
