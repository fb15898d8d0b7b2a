"""``dpadmm reproduce --paper 001``: Hu et al.'s Figs. 1-3, with the choices the paper leaves open.

The paper (001, Section 5) trains l2-regularised logistic regression by ADMM sharing on a9a (two
parties: the first 66 and the last 57 features) and gisette (three parties), against an SGD-trained
vertical model (FDML) and two centralised scikit-learn models (all features; party 1's alone). It
prints no hyper-parameter and three numbers: on gisette ADMM "quickly converges to 0.08" test log
loss "after a few epochs" while SGD "converges to only 0.1 with much more epochs"; on a9a the two
end equal. Fig. 3 plots the test log loss under "different levels of Gaussian noise", whose values
are not given. The choices here:

- **gisette's stand-in**: gisette cannot be obtained here; it was built from MNIST's digits 4 and 9,
  so ``mnist-4v9`` (11,791 training and 1,991 test images, 784 pixels over three parties,
  262, 261 and 261 columns) takes its place. Its numbers are not gisette's.
- **the objective**: the family's (:mod:`dpadmm.sharing.config`): mean log loss + l2 ||x||^2 / 2 with
  l2 = 1e-4, rows of unit norm within each party's block, every x_m in the ball of radius
  ``x-bound`` = 10, rho = 1/(2N). The same features and objective for every method.
- **epochs**: an ADMM epoch is one round (every party touches all N samples once); an SGD epoch is
  one pass over mini-batches of ``--batch`` = 100. Both run ``--epochs`` = 100 and are recorded after
  each epoch.
- **the step parameters**, which the paper does not give, are tuned alike on training data: every
  SGD learning rate of ``--rates`` and every ADMM penalty of ``--rhos`` runs without noise, and each
  method is reported at the one with the lowest training objective at the last epoch (seed 0 for
  ADMM, which draws nothing without noise; the mean of the seeds for SGD). rho is given in units of
  the loss gradient's Lipschitz constant L = 1/(4N): 001's Assumption 1.2 needs rho >= L, and the
  family's default is 2 L. The noisy cells run at ADMM's chosen rho. SGD starts from N(0, 0.01^2)
  (the paper: "initialized randomly").
- **noise levels**: Fig. 3 sweeps sigma directly (``--sigmas``, in units of the message entries),
  each in both noise modes: ``paper`` (eq. (16): N(0, sigma^2 (D_m^T D_m + tau I)^-1) on x_m, what the
  paper runs, not covered by the guarantee) and ``message`` (N(0, sigma^2 I_N) on the message, the
  Gaussian mechanism). Beside them, the message noise that Theorem 3 asks for at each ``--eps``
  per round. What a sigma implies for privacy is computed, not assumed: the message mode's
  multiplier sigma / C with C = 2 b sqrt(N), its exact per-round epsilon and the T rounds'
  (T Gaussian releases compose exactly to one with multiplier (sigma / C) / sqrt(T)).
- ``--seeds`` = 3 per noisy cell (mean and standard deviation); the noise-free runs run once.

The grid runs as cells of :mod:`dpadmm.runs.grid` (in this process, or N at a time on Ray, with the same
numbers), in two stages, since the noisy runs need the rho that the noise-free ones choose:

1. per data set: ``<data>/problem`` (its row of ``problems.csv``), ``<data>/scikit-learn/<model>`` (one
   per centralised baseline), ``<data>/ADMM/no-noise/rho=<r>`` (one per rho, seed 0) and ``<data>/SGD``
   (every rate and seed as one batch);
2. per data set, at its chosen rho: ``<data>/ADMM/<mode>-noise/sigma=<s>/rho=<r>`` for every sigma and
   mode and ``<data>/ADMM/message-noise/eps=<e>/rho=<r>`` (Theorem 3's sigma), the seeds as one batch.

A cell loads its data set itself (once per process) and returns its rows; the driver appends them to the CSV
files in ``--out`` (``problems.csv``, ``baselines.csv``, ``curves.csv``) in the grid's order, whichever cell
finishes first, and rebuilds ``summary.md``, ``fig1-a9a.png``, ``fig2-mnist-4v9.png`` and ``fig3-noise.png``
from them. A cell whose rows the files hold is complete: a second call skips it and an interrupted call
resumes with the cells it had not committed.
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
from typing import TYPE_CHECKING, Any

from dpadmm.runs import references
from dpadmm.runs.estimate import Estimate, Unit
from dpadmm.runs.estimate import estimate as estimate_units
from dpadmm.runs.grid import Cell, GridOptions, GridRunner, Workspace
from dpadmm.runs.tables import Tables, from_args
from dpadmm.sharing.config import DATASETS, SharingConfig

if TYPE_CHECKING:  # the engine (torch) is imported where it runs: ``dpadmm --help`` builds Grid without it
    from dpadmm.sharing.engine import Problem

PAPER_PARTIES = {"a9a": "66,57", "mnist-4v9": "262,261,261"}  # 001's a9a split; gisette's 3 parties, thirds
FOLDERS = {"a9a": "a9a", "mnist-4v9": "mnist"}  # the sub-folder of --data-dir that holds each data set
FIGURES = {"a9a": "fig1-a9a.png", "mnist-4v9": "fig2-mnist-4v9.png"}  # 001's Fig. 1 (a9a), Fig. 2 (gisette)
NOISES = ("paper", "message")
CONVERGED = (1e-2, 1e-3)  # claim 1: epochs until the training objective is within these of scikit-learn's

FILES = {
    "problems": ("dataset", "parties", "samples", "test_samples", "rho", "sensitivity"),
    "baselines": ("dataset", "model", "train_objective", "test_log_loss", "test_error", "largest_block_norm",
                  "seconds"),
    "curves": ("dataset", "method", "noise", "sigma", "eps", "step", "seed", "epoch", "train_objective",
               "test_log_loss", "test_error", "elapsed"),
}  # step: SGD's learning rate, ADMM's rho in units of 1/(4N)
BASELINES = {"all features": None, "party 1 alone": [0]}  # scikit-learn on these parties' columns
REFERENCES = ("001", "hu2019")  # what summary.md cites (dpadmm.runs.references): 001 and its SGD baseline


@dataclass(frozen=True)
class Grid:
    """What ``dpadmm reproduce --paper 001`` runs; the defaults are the grid of ``docs/results/001``."""

    out: str = "reproduce-001"
    data_dir: str = ""  # a folder with a9a/ and mnist/; empty: the cache
    datasets: tuple[str, ...] = DATASETS
    epochs: int = 100
    sigmas: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
    eps: tuple[float, ...] = (1.0,)
    seeds: int = 3
    rates: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0)
    rhos: tuple[float, ...] = (1.0, 2.0, 4.0)  # in units of L = 1/(4N)
    batch: int = 100
    delta: float = 1e-5
    dtype: str = "float64"
    device: str = "cpu"

    def __post_init__(self) -> None:
        bad = [d for d in self.datasets if d not in DATASETS]
        if bad or not self.datasets:
            raise ValueError(f"datasets={','.join(self.datasets)!r} is not allowed; choose among "
                             f"{', '.join(DATASETS)}")
        for name in ("sigmas", "rates"):
            if any(not 0 < v < math.inf for v in getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; give finite values > 0")
        if not self.rhos or any(not 1 <= r < math.inf for r in self.rhos):
            raise ValueError(f"rhos={self.rhos!r} is not allowed; give finite values >= 1 (rho in units of "
                             "1/(4N); 001's Assumption 1.2 needs rho >= 1/(4N))")
        if self.epochs < 1 or self.seeds < 1 or self.batch < 1 or not self.rates:
            raise ValueError(f"epochs={self.epochs}, seeds={self.seeds} and batch={self.batch} must be >= 1, "
                             "with at least one rate")
        if not all(0 < eps < math.inf for eps in self.eps):  # the family would read inf as non-private
            raise ValueError(f"eps={','.join(map(str, self.eps))!r} is not allowed: 001's figures are "
                             "private runs, each eps in (0, 1]; the grid runs a non-private baseline itself")
        for eps in self.eps:  # the family's own checks and messages (0 < eps <= 1, delta)
            self.config("a9a", eps, "message")
        SharingConfig(dtype=self.dtype, device=self.device, delta=self.delta)

    def config(self, dataset: str, epsilon: float, noise: str, rho: float = 0.0) -> SharingConfig:
        """A run of the grid: the family's defaults and the grid's choices, evaluated every epoch."""
        return SharingConfig(epsilon=epsilon, delta=self.delta, noise=noise, rounds=self.epochs, rho=rho,
                             dataset=dataset,
                             data_dir=str(Path(self.data_dir) / FOLDERS[dataset]) if self.data_dir else "",
                             parties=PAPER_PARTIES[dataset], dtype=self.dtype, device=self.device,
                             eval_every=1)

    def settings(self) -> dict[str, Any]:
        """What a resumed call must agree on with the one that wrote the folder (not where it reads from)."""
        return {k: v for k, v in asdict(self).items() if k not in ("out", "data_dir", "datasets", "device")}


def grid_from_args(**kwargs: Any) -> Grid:
    """A Grid from command-line values (comma-separated lists as strings)."""
    return from_args(Grid, **kwargs)


def multiplier(sigma: float, sensitivity: float) -> float:
    """The Gaussian mechanism's noise multiplier sigma / C of one message."""
    return sigma / sensitivity


def implied_epsilon(sigma: float, sensitivity: float, releases: int, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``releases`` Gaussian releases of multiplier sigma / C: they compose
    to one release of multiplier (sigma / C) / sqrt(releases) (Gaussian differential privacy, Dong, Roth &
    Su 2022, Cor. 2.5); inf where it exceeds what dp-accounting resolves."""
    from dpadmm.privacy.ledger import Release, single_release

    try:
        composed = Release("gaussian", multiplier(sigma, sensitivity) / math.sqrt(releases))
        return single_release(composed, delta)
    except (ValueError, OverflowError):
        return math.inf


# ----- the runs: cells in two stages -----


def run_grid(grid: Grid, options: GridOptions | None = None, *, log: Callable[[str], None] = print) -> Path:
    """Run every cell of ``grid`` not yet in ``grid.out`` (:mod:`dpadmm.runs.grid`: here, or on Ray with
    ``options``), appending each cell's rows as it completes, then write the report; returns the folder.

    Two stages, because the noisy cells run at the rho that the noise-free runs choose: stage 1 holds every
    data set's problem row, scikit-learn baselines, noise-free ADMM (one cell per rho) and vertical SGD;
    stage 2 the noisy cells of every data set at its chosen rho. Raises
    :class:`dpadmm.runs.grid.CellsFailed` at the end if cells failed (the others are committed and
    reported; a data set whose stage-1 cells it needs failed runs no noisy cells until the next call)."""
    out = Path(grid.out)
    tables = Tables(out, FILES)
    tables.claim(grid.settings())
    try:
        with GridRunner(out, options or GridOptions(), log=log) as runner:
            first = [cell for dataset in grid.datasets for cell in _first_cells(grid, tables, dataset)]
            runner.run(first, functools.partial(_commit, out, _report_points(first)))
            noisy = [cell for dataset in grid.datasets for cell in _noisy_cells(grid, tables, dataset, log)]
            runner.run(noisy, functools.partial(_commit, out, _report_points(noisy)))
    finally:
        _problem.cache_clear()  # the driver's copy: the data sets are not needed after the runs
    write_report(out)
    runner.raise_failures()
    return out


def _first_cells(grid: Grid, tables: Tables, dataset: str) -> list[Cell]:
    """Stage 1 of ``dataset``: its problems row, the scikit-learn baselines, noise-free ADMM at each rho and
    vertical SGD (all rates and seeds in one batch), each done when its rows are in the tables."""
    held = {r["model"] for r in tables.read("baselines") if r["dataset"] == dataset}
    done = _curves_done(tables, dataset)
    cells = [Cell(key=f"{dataset}/problem", run=functools.partial(_run_problem, grid, dataset),
                  done=dataset in {r["dataset"] for r in tables.read("problems")})]
    cells += [Cell(key=f"{dataset}/scikit-learn/{model.replace(' ', '-')}",
                   run=functools.partial(_run_baseline, grid, dataset, model), done=model in held)
              for model in BASELINES]
    cells += [_admm_cell(grid, dataset, "none", 0.0, 0.0, step, (0,), done) for step in grid.rhos]
    cells.append(Cell(key=f"{dataset}/SGD", run=functools.partial(_run_sgd, grid, dataset),
                      done=any(method == "SGD" for method, *_ in done)))
    return cells


def _noisy_cells(grid: Grid, tables: Tables, dataset: str, log: Callable[[str], None]) -> list[Cell]:
    """Stage 2 of ``dataset``: ADMM at the rho of the noise-free runs with the lowest final training
    objective, under every sigma in both noise modes and at Theorem 3's sigma of each eps. None when stage
    1 left no noise-free run or no problems row (a failed cell): the next call runs them."""
    rho = best_step(mean_curves(tables.read("curves")), dataset, "ADMM")
    known = [r for r in tables.read("problems") if r["dataset"] == dataset]
    if rho is None or not known:
        log(f"{dataset}: its noisy cells wait for the next call (no noise-free ADMM run or problems row)")
        return []
    from dpadmm.sharing import privacy

    # exact, from N (the table's 9 digits would move Theorem 3's sigma in its last digits)
    sensitivity = privacy.message_sensitivity(int(known[0]["samples"]), grid.config(dataset, math.inf,
                                                                                      "message").x_bound)
    levels = [(noise, sigma, 0.0) for noise in NOISES for sigma in grid.sigmas]
    levels += [("message", privacy.theorem_3_std(eps, grid.delta, sensitivity), eps) for eps in grid.eps]
    done = _curves_done(tables, dataset)
    seeds = tuple(range(grid.seeds))
    cells: list[Cell] = []
    planned: set[tuple[str, float]] = set()
    for noise, sigma, eps in levels:
        identity = (noise, float(f"{sigma:.9g}"))  # a curve's key as the table holds it: once per curve
        if identity not in planned:
            planned.add(identity)
            cells.append(_admm_cell(grid, dataset, noise, sigma, eps, rho, seeds, done))
    return cells


def _curves_done(tables: Tables, dataset: str) -> set[tuple[str, str, float, float]]:
    """(method, noise, sigma, step) of every curve of ``dataset`` in curves.csv."""
    return {(r["method"], r["noise"], float(r["sigma"]), float(r["step"])) for r in tables.read("curves")
            if r["dataset"] == dataset}


def _admm_cell(grid: Grid, dataset: str, noise: str, sigma: float, eps: float, step: float,
               seeds: tuple[int, ...], done: set[tuple[str, str, float, float]]) -> Cell:
    """ADMM sharing at rho = ``step``/(4N) under ``noise`` of level ``sigma`` (Theorem 3's for ``eps`` > 0),
    its seeds as one batch; done when curves.csv holds its curve (sigma and rho as the table writes them)."""
    level = "no-noise" if noise == "none" else (f"{noise}-noise/eps={eps:g}" if eps
                                                 else f"{noise}-noise/sigma={sigma:.9g}")
    curve = ("ADMM", noise, float(f"{sigma:.9g}"), float(f"{step:.9g}"))
    return Cell(key=f"{dataset}/ADMM/{level}/rho={step:.9g}",
                run=functools.partial(_run_admm, grid, dataset, noise, sigma, eps, step, seeds),
                done=curve in done)


@functools.lru_cache(maxsize=len(DATASETS))
def _problem(config: SharingConfig) -> Problem:
    """The problem of ``config``, loaded once per process: a worker running many cells of a data set (or
    this process, running them one after another) reads and splits it once."""
    from dpadmm.sharing import engine

    return engine.load(config)


def _load(grid: Grid, dataset: str) -> tuple[SharingConfig, Problem]:
    """(the noise-free configuration of ``dataset``, its problem): what every cell of the data set shares."""
    free = grid.config(dataset, math.inf, "message")
    return free, _problem(free)


Rows = dict[str, list[dict[str, Any]]]  # a cell's results: table name -> rows to append


def _run_problem(grid: Grid, dataset: str, workspace: Workspace) -> Rows:
    """The problems row of ``dataset``: its split, sizes, default rho and message sensitivity C."""
    from dpadmm.sharing import privacy

    free, problem = _load(grid, dataset)
    n = problem.num_samples
    return {"problems": [{"dataset": dataset, "parties": free.parties, "samples": n,
                          "test_samples": int(problem.test_labels.shape[0]), "rho": free.penalty(n),
                          "sensitivity": privacy.message_sensitivity(n, free.x_bound)}]}


def _run_baseline(grid: Grid, dataset: str, model: str, workspace: Workspace) -> Rows:
    """scikit-learn's minimiser of the objective on the columns of ``model`` (:data:`BASELINES`)."""
    from dpadmm.sharing import baselines

    free, problem = _load(grid, dataset)
    began = time.perf_counter()
    fit = baselines.centralised(problem, free.l2, BASELINES[model])
    return {"baselines": [{"dataset": dataset, "model": model, "seconds": time.perf_counter() - began,
                           **{k.replace("-", "_"): v for k, v in fit.items()}}]}


def _run_admm(grid: Grid, dataset: str, noise: str, sigma: float, eps: float, step: float,
              seeds: tuple[int, ...], workspace: Workspace) -> Rows:
    """ADMM sharing's curves (every epoch of every seed) at rho = ``step``/(4N) and noise level ``sigma``."""
    from dpadmm.sharing import engine

    _, problem = _load(grid, dataset)
    config = grid.config(dataset, math.inf, "message" if noise == "none" else noise,
                         step / (4 * problem.num_samples))
    runs = engine.run(config, seeds, problem=problem, write=False, progress=False, std=sigma).records
    return {"curves": [row for seed, records in zip(seeds, runs, strict=True)
                       for row in _curve_rows(dataset, "ADMM", noise, sigma, eps, step, seed, records)]}


def _run_sgd(grid: Grid, dataset: str, workspace: Workspace) -> Rows:
    """Vertical SGD's curves at every rate and seed, run as one batch; each run's elapsed time is an even
    share of the batch's."""
    from dpadmm.sharing import baselines

    free, problem = _load(grid, dataset)
    seeds = list(range(grid.seeds))
    began = time.perf_counter()
    runs = baselines.vertical_sgd(problem, free.l2, grid.rates, seeds, grid.epochs, grid.batch)
    per_run = (time.perf_counter() - began) / len(runs)
    rows = []
    for i, records in enumerate(runs):
        rate, seed = grid.rates[i // len(seeds)], seeds[i % len(seeds)]
        timed = [{**r, "elapsed": per_run * r["epoch"] / grid.epochs} for r in records]
        rows += _curve_rows(dataset, "SGD", "none", 0.0, 0.0, rate, seed, timed)
    return {"curves": rows}


def _report_points(cells: Sequence[Cell]) -> frozenset[str]:
    """The cells after whose commit the report is rebuilt: each data set's last cell to run in a stage (the
    figures take a second or two to draw; the report is rebuilt at the end in any case)."""
    last: dict[str, str] = {}
    for cell in cells:
        if not cell.done:
            last[cell.key.split("/")[0]] = cell.key
    return frozenset(last.values())


def _commit(out: Path, report_after: frozenset[str], cell: Cell, result: Rows) -> None:
    """A completed cell: its rows appended to their tables (in the grid's order, whichever way it ran), then
    the report where a data set's stage is complete."""
    Tables(out, FILES).append_all(result)
    if cell.key in report_after:
        write_report(out)


def estimate(grid: Grid) -> Estimate:
    """The wall time of the runs of ``grid`` not yet in ``grid.out``, before any runs: ADMM sharing without
    noise (one per rho), under each noise (the seeds batched) and at each eps, and vertical SGD, every one
    ``epochs`` long and evaluated every epoch. Each kind runs a few epochs on the loaded data set
    (:mod:`dpadmm.runs.estimate`); the loading is timed and counted once per data set."""
    from dpadmm.sharing import baselines, engine, privacy

    tables = Tables(Path(grid.out), FILES)
    rows = tables.read("curves")
    units: list[Unit] = []
    loading = 0.0
    sklearn = False
    for dataset in grid.datasets:
        free = grid.config(dataset, math.inf, "message")
        sklearn |= {r["model"] for r in tables.read("baselines") if r["dataset"] == dataset} != set(BASELINES)
        done = {(r["method"], r["noise"], float(r["sigma"]), float(r["step"])) for r in rows
                if r["dataset"] == dataset}
        rho = best_step(mean_curves(rows), dataset, "ADMM")  # None until the noise-free runs are in
        known = [r for r in tables.read("problems") if r["dataset"] == dataset]
        sigmas = [(noise, sigma) for noise in NOISES for sigma in grid.sigmas]
        if known:  # Theorem 3's sigma at each eps needs the sensitivity, which the first call wrote
            sensitivity = float(known[0]["sensitivity"])
            sigmas += [("message", privacy.theorem_3_std(eps, grid.delta, sensitivity)) for eps in grid.eps]
        else:
            sigmas += [("message", 1.0)] * len(grid.eps)
        wanted = [("none", 0.0, step, 1) for step in grid.rhos if ("ADMM", "none", 0.0, step) not in done]
        wanted += [(noise, sigma, rho or grid.rhos[0], grid.seeds) for noise, sigma in sigmas
                   if rho is None or ("ADMM", noise, float(f"{sigma:.9g}"), rho) not in done]
        sgd = not any(method == "SGD" for method, *_ in done)
        if not wanted and not sgd:
            continue
        began = time.perf_counter()
        problem = engine.load(free)
        loading += time.perf_counter() - began
        n = problem.num_samples
        for noise, sigma, step, seeds in wanted:
            config = grid.config(dataset, math.inf, "message" if noise == "none" else noise, step / (4 * n))

            def run(k: int, config: SharingConfig = config, sigma: float = sigma, seeds: int = seeds,
                    problem: Any = problem) -> list[dict[str, Any]]:
                return engine.run(dataclasses.replace(config, rounds=k), range(seeds), problem=problem,
                                  write=False, progress=False, std=sigma).records[0]

            units.append(Unit(key=(dataset, noise, seeds), iterations=grid.epochs, evaluations=grid.epochs,
                              probe=run))
        if sgd:

            def sgd_run(k: int, problem: Any = problem, l2: float = free.l2) -> list[dict[str, Any]]:
                began = time.perf_counter()
                baselines.vertical_sgd(problem, l2, grid.rates, list(range(grid.seeds)), k, grid.batch)
                per_epoch = (time.perf_counter() - began) / k  # its evaluations included
                return [{"seconds": per_epoch}] * k

            units.append(Unit(key=(dataset, "SGD"), iterations=grid.epochs, evaluations=0, probe=sgd_run))
    found = estimate_units(units, excluded="the scikit-learn baselines not yet in --out" if sklearn else "")
    return dataclasses.replace(found, seconds=found.seconds + loading)


def _curve_rows(dataset: str, method: str, noise: str, sigma: float, eps: float, step: float,
                seed: int, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"dataset": dataset, "method": method, "noise": noise, "sigma": sigma, "eps": eps, "step": step,
             "seed": seed, "epoch": r.get("round", r.get("epoch")), "train_objective": r["train-objective"],
             "test_log_loss": r["test-log-loss"], "test_error": r["test-error"], "elapsed": r["elapsed"]}
            for r in records]


# ----- the report -----


Curve = dict[str, list[float]]
Curves = dict[tuple[str, str, str, float, float], Curve]  # (dataset, method, noise, sigma, step) -> its curve
Steps = dict[str, tuple[float | None, float | None]]  # dataset -> (ADMM's rho, SGD's rate), each its best


def mean_curves(rows: Iterable[dict[str, str]]) -> Curves:
    """(dataset, method, noise, sigma, step) -> epoch and each metric's mean (and ``*_std``) over seeds."""
    grouped: dict[tuple[str, str, str, float, float], dict[int, list[dict[str, str]]]] = defaultdict(
        lambda: defaultdict(list))
    for r in rows:
        key = (r["dataset"], r["method"], r["noise"], float(r["sigma"]), float(r["step"]))
        grouped[key][int(r["epoch"])].append(r)
    curves: Curves = {}
    for key, epochs in grouped.items():
        curve: Curve = defaultdict(list)
        for epoch, group in sorted(epochs.items()):
            curve["epoch"].append(epoch)
            curve["eps"].append(float(group[0]["eps"]))
            for name in ("train_objective", "test_log_loss", "test_error", "elapsed"):
                values = [float(r[name]) for r in group]
                curve[name].append(statistics.fmean(values))
                curve[f"{name}_std"].append(statistics.stdev(values) if len(values) > 1 else 0.0)
        curves[key] = dict(curve)
    return curves


def best_step(curves: Curves, dataset: str, method: str) -> float | None:
    """The step parameter of ``method`` (SGD's rate, ADMM's rho) whose noise-free runs have the lowest mean
    training objective at the last epoch."""
    options = [(c["train_objective"][-1], key[4]) for key, c in curves.items()
               if key[:3] == (dataset, method, "none")]
    return min(options)[1] if options else None


def first_within(curve: Curve, target: float, level: float) -> int | None:
    """The first epoch whose mean training objective is within ``level`` (relative) of ``target``."""
    return next((e for e, f in zip(curve["epoch"], curve["train_objective"], strict=True)
                 if f - target <= level * abs(target)), None)


def write_report(out: Path) -> None:
    """summary.md and the figures from the CSV files in ``out``."""
    from dpadmm.sharing import figures

    tables = Tables(out, FILES)
    settings = tables.settings()
    problems = {r["dataset"]: r for r in tables.read("problems")}
    base = {(r["dataset"], r["model"]): r for r in tables.read("baselines")}
    curves = mean_curves(tables.read("curves"))
    steps = {d: (best_step(curves, d, "ADMM"), best_step(curves, d, "SGD")) for d in problems}
    for dataset in problems:
        figures.epochs(out / FIGURES[dataset], dataset, curves, steps[dataset], base)
    figures.noise(out / "fig3-noise.png", list(problems), curves, base)
    (out / "summary.md").write_text(summary(settings, problems, base, curves, steps), encoding="utf-8")


def _fmt(curve: Curve, name: str, i: int = -1, digits: int = 4) -> str:
    std = curve[f"{name}_std"][i]
    return f"{curve[name][i]:.{digits}f}" + (f" ± {std:.{digits}f}" if std else "")


def summary(settings: dict[str, Any], problems: dict[str, dict[str, str]], base: dict[tuple[str, str], dict],
            curves: Curves, steps: Steps) -> str:
    """The report: settings, baselines, Figs. 1-3 in numbers, the privacy of each noise level, the claims.
    ``steps``: per data set, (ADMM's rho in units of 1/(4N), SGD's rate), each its best."""
    epochs, delta = settings["epochs"], settings["delta"]
    lines = [
        "# Paper 001 reproduced: ADMM sharing for vertical federated learning (Hu et al.)",
        "",
        "Written by `dpadmm reproduce --paper 001`; every number below is computed from the CSV files "
        "beside this one. Objective: mean log loss + 1e-4 ||x||^2 / 2 on rows of unit norm within each "
        f"party's block; x-bound 10; {epochs} epochs; ADMM: rho of {_list(settings['rhos'])} times "
        f"1/(4N), SGD: batch {settings['batch']}, rate of {_list(settings['rates'])}, each with its lowest "
        f"final training objective; {settings['seeds']} seeds per noisy cell (mean ± std); "
        f"{settings['dtype']}. mnist-4v9 "
        "stands in for gisette (MNIST's 4s and 9s, from which gisette was built). Why these, in "
        "`dpadmm/sharing/reproduce.py`.",
        "",
        "## The problems and the centralised baselines (scikit-learn, the same objective)",
        "",
        "| data | parties | N | N test | model | training objective | test log loss | test error | "
        "largest ||x_m|| |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d, p in problems.items():
        for model in BASELINES:
            b = base.get((d, model))
            if b:
                lines.append(f"| {d} | {p['parties']} | {p['samples']} | {p['test_samples']} | {model} | "
                             f"{float(b['train_objective']):.6f} | {float(b['test_log_loss']):.4f} | "
                             f"{float(b['test_error']):.4f} | {float(b['largest_block_norm']):.2f} |")
    lines += ["", "## The step parameters: final training objective without noise", "",
              "ADMM's rho in units of 1/(4N), SGD's learning rate (mean over seeds); each method is reported "
              "below at its lowest (bold).", "", "| data | method | step: final training objective |",
              "| --- | --- | --- |"]
    for d in problems:
        for method, best in zip(("ADMM", "SGD"), steps[d], strict=True):
            tried = sorted((key[4], c["train_objective"][-1]) for key, c in curves.items()
                           if key[:3] == (d, method, "none"))
            lines.append(f"| {d} | {method} | " + ", ".join(
                (f"**{step:g}: {value:.6f}**" if step == best else f"{step:g}: {value:.6f}")
                for step, value in tried) + " |")
    lines += ["", "## Figs. 1-2: ADMM sharing against vertical SGD, by epoch", ""]
    checkpoints = [e for e in (1, 2, 5, 10, 20, 50, 100, 200, 500) if e <= epochs]
    for d in problems:
        lines += [f"![{d}]({FIGURES[d]})", ""]
        target = _baseline(base, d, "all features", "train_objective")
        admm, sgd = _noise_free(curves, d, steps[d])
        lines += [f"**{d}** (ADMM at rho = {_list(steps[d][:1])}/(4N), SGD at rate {_list(steps[d][1:])}): "
                  "test log loss after each number of epochs (mean over seeds), "
                  "the epoch at which the training objective is first within "
                  + " and ".join(f"{c:g}" for c in CONVERGED) + " (relative) of scikit-learn's, and the "
                  "seconds per epoch:", "",
                  "| method | " + " | ".join(f"{e}" for e in checkpoints) + " | best (epoch) | "
                  + " | ".join(f"within {c:g}" for c in CONVERGED) + " | s per epoch |",
                  "| --- | " + " | ".join("---" for _ in checkpoints) + " | --- | "
                  + " | ".join("---" for _ in CONVERGED) + " | --- |"]
        for label, curve in (("ADMM", admm), ("SGD", sgd)):
            if not curve:
                continue
            at = dict(zip(curve["epoch"], curve["test_log_loss"], strict=True))
            best = min(range(len(curve["epoch"])), key=lambda i: curve["test_log_loss"][i])
            hits = [first_within(curve, target, c) for c in CONVERGED]
            lines.append(f"| {label} | " + " | ".join(f"{at[e]:.4f}" for e in checkpoints) + " | "
                         f"{curve['test_log_loss'][best]:.4f} ({curve['epoch'][best]}) | "
                         + " | ".join("—" if h is None else str(h) for h in hits)
                         + f" | {curve['elapsed'][-1] / curve['epoch'][-1]:.3f} |")
        lines.append("")
    lines += ["## Fig. 3: test log loss against the noise level", "", "![Fig. 3](fig3-noise.png)", "",
              "Final test log loss (mean ± std over seeds) by noise level sigma and mode. The privacy "
              "columns are the message mode's (the paper mode is not covered): the multiplier sigma / C "
              f"with C = 2 b sqrt(N), the exact epsilon of one round and of the {epochs} rounds at "
              f"delta = {delta:g} per party (a party's features, replace-its-block neighbours; exact, so "
              "below Theorem 3's bound).", ""]
    for d, p in problems.items():
        c = float(p["sensitivity"])
        party1 = _baseline(base, d, "party 1 alone", "test_log_loss")
        full = _baseline(base, d, "all features", "test_log_loss")
        lines += [f"**{d}** (C = {c:.6g}; scikit-learn: all features {full:.4f}, party 1 alone "
                  f"{party1:.4f})", "",
                  "| sigma | paper noise | message noise | sigma / C | eps per round | eps of the run |",
                  "| --- | --- | --- | --- | --- | --- |"]
        sigmas = sorted({key[3] for key in curves if key[0] == d and key[1] == "ADMM" and key[2] != "none"})
        for sigma in sigmas:
            cells = []
            for noise in NOISES:
                curve = curves.get((d, "ADMM", noise, sigma, steps[d][0] or 0.0))
                cells.append(_fmt(curve, "test_log_loss") if curve else "")
            message = curves.get((d, "ADMM", "message", sigma, steps[d][0] or 0.0))
            label = f"{sigma:.6g}" + (f" (Theorem 3, eps = {message['eps'][0]:g})"
                                      if message and message["eps"][0] else "")
            lines.append(f"| {label} | {cells[0]} | {cells[1]} | {multiplier(sigma, c):.3g} | "
                         f"{implied_epsilon(sigma, c, 1, delta):.4g} | "
                         f"{implied_epsilon(sigma, c, epochs, delta):.4g} |")
        lines.append("")
    lines += ["## The paper's claims", ""]
    lines += _claims(problems, base, curves, steps)
    lines += ["", *references.section(REFERENCES)]
    return "\n".join(lines) + "\n"


def _epochs(epoch: int | None, total: int) -> str:
    return f"more than {total}" if epoch is None else str(epoch)


def _ball(norm: float) -> str:
    """Whether the ball ||x_m|| <= x-bound binds at scikit-learn's solution: ADMM's minimum is then higher."""
    bound = SharingConfig().x_bound
    if not norm > bound:
        return ""
    return (f" The ball ||x_m|| <= {bound:g} binds: scikit-learn's solution has a block of norm {norm:.2f}, "
            "so ADMM's problem has a higher minimum than scikit-learn's.")


def _baseline(base: dict[tuple[str, str], dict], dataset: str, model: str, column: str) -> float:
    """A scikit-learn baseline's value (nan before it has run)."""
    row = base.get((dataset, model))
    return float(row[column]) if row else math.nan


def _list(values: Iterable[float | None]) -> str:
    return ", ".join("—" if v is None else f"{v:g}" for v in values)


def _noise_free(curves: Curves, dataset: str, steps: tuple[float | None, float | None]
                ) -> tuple[Curve | None, Curve | None]:
    """(ADMM's noise-free curve at its rho, SGD's at its rate)."""
    return (curves.get((dataset, "ADMM", "none", 0.0, steps[0] or 0.0)),
            curves.get((dataset, "SGD", "none", 0.0, steps[1] or 0.0)))


def _claims(problems: dict[str, dict[str, str]], base: dict[tuple[str, str], dict],
            curves: Curves, steps: Steps) -> list[str]:
    """Each claim of 001 with the numbers that decide it here."""
    lines = []
    for d in problems:
        admm, sgd = _noise_free(curves, d, steps[d])
        if not admm or (d, "all features") not in base:
            continue
        target = _baseline(base, d, "all features", "train_objective")
        party1 = _baseline(base, d, "party 1 alone", "test_log_loss")
        full = _baseline(base, d, "all features", "test_log_loss")
        total = admm["epoch"][-1]
        hit = _epochs(first_within(admm, target, CONVERGED[0]), total)
        lines.append(f"- **{d}, converges in few epochs**: ADMM's training objective is within "
                     f"{CONVERGED[0]:g} of scikit-learn's after {hit} epochs; its test log loss is "
                     f"{admm['test_log_loss'][-1]:.4f} after {total} (scikit-learn, all "
                     f"features: {full:.4f})."
                     + _ball(_baseline(base, d, "all features", "largest_block_norm")))
        if sgd:
            lines.append(f"- **{d}, against SGD** (the paper, gisette: ADMM 0.08, SGD 0.1): final test log "
                         f"loss ADMM {admm['test_log_loss'][-1]:.4f}, SGD {sgd['test_log_loss'][-1]:.4f}; "
                         "within "
                         f"{CONVERGED[0]:g} of the optimum after {hit} and "
                         f"{_epochs(first_within(sgd, target, CONVERGED[0]), total)} epochs.")
        beats = {}
        for noise in NOISES:
            winning = [key[3] for key, c in curves.items() if key[:3] == (d, "ADMM", noise)
                       and c["test_log_loss"][-1] < party1]
            beats[noise] = max(winning) if winning else None
        found = ", ".join(f"{noise} noise {'none' if s is None else f'{s:g}'}" for noise, s in beats.items())
        lines.append(f"- **{d}, with moderate noise it beats party 1 alone** ({party1:.4f}): the largest "
                     f"sigma whose mean final test log loss is below it: {found}.")
    return lines
