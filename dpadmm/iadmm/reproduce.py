"""``dpadmm reproduce``: the papers' experiment grid, resumable, reported next to the papers' numbers.

The grid of Ryu & Kim (003 Section IV, 000 Section V): algorithms iadmm, objp, objpm (E=10),
objt and outp; eps-bar in {0.05, 0.1, 1, 5} (and 3, for 000's figure); MNIST with P = 10
and FEMNIST with P = 195; 10 seeds; T = 20,000 rounds. Two settings the papers leave open get
a cell each: objt with 000's radius a/t^2 and with the constant radius of the authors' code
(``--trust-radii``), and the non-private iadmm with E = 1 and E = 10 (``--iadmm-steps``; 003
defines it as Algorithm 1 with eps = inf without saying which E). Every cell (data set,
algorithm and variant, eps-bar) runs its seeds together as one batch of the engine
(:func:`dpadmm.iadmm.engine.run_seeds`). A non-private cell runs seed 0 alone: without noise nothing in
a run depends on the seed (full batches, zero start), so more seeds would repeat the same numbers.

The runs use the papers' calibration, ``sensitivity="data-dependent"`` (eq. (9b) evaluated
on the agent's own data), because the point is to reproduce their numbers; the privacy
columns of the report are therefore nominal: Theorem 1 does not cover that calibration
(see the privacy section of docs/families/iadmm.md and :mod:`dpadmm.iadmm.audit`). ``dpadmm train`` keeps the
covered, clipped default.

Layout of ``out``::

    runs/<dataset>-<label>-eps<eps>/seed-<s>/       config.json, privacy.json, metrics.jsonl
                                                    (label: algorithm_label, e.g. objt-reference)
    runs/<cell>/checkpoint.pt                       while the cell runs (resume point)
    runs/<cell>/cell.json                           when it is complete (config, seeds, wall time)
    results.csv, summary.md, fig-*.png              rebuilt from every completed cell

A second call with the same arguments skips completed cells and resumes an interrupted one
from its last checkpoint; a cell that exists with other settings is an error, never
overwritten. Calls with other data sets, algorithms or eps-bar add cells to the same folder.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpadmm.iadmm.config import ALGORITHMS, DEVICES, DTYPES, TRUST_RADII, RunConfig, papers
from dpadmm.runs import references
from dpadmm.runs.estimate import Estimate, Unit, evaluations
from dpadmm.runs.estimate import estimate as estimate_units
from dpadmm.runs.grid import Cell, GridOptions, GridRunner, Workspace

# The engine, the data and numpy are imported where they are used, so that the ``dpadmm`` command can build
# its parser from GridConfig without them (``dpadmm --help`` in well under a second).

SENSITIVITY = "data-dependent"  # the papers' calibration, eq. (9b)
PAPER_EPS = (0.05, 0.1, 1.0, 3.0, 5.0)
PAPER_DATASETS = ("mnist", "femnist")
PAPER_ROUNDS = 20000
PAPER_SEEDS = 10
FULL_COMMAND = ("dpadmm reproduce --out reproduce --mnist-dir ../shared/data/mnist "
                "--femnist-dir ../shared/data/femnist")
# The works summary.md cites (:mod:`dpadmm.runs.references`): the two papers and their OutP baseline.
REFERENCES = ("003", "000", "huang2019")
CSV_FIELDS = ("dataset", "algorithm", "eps", "local_steps", "rounds", "seed", "round", "test_error",
              "train_loss", "consensus_violation", "noise_magnitude", "rho", "seconds")

# Test error (percent) the papers report for T = 20,000, by (dataset, algorithm, eps-bar; inf =
# non-private), with where it is from and what it summarises.
PAPER_RESULTS: dict[tuple[str, str, float], list[tuple[float, str]]] = {
    ("mnist", "iadmm", math.inf): [(9.1, "003, non-private"), (7.42, "000, non-private")],
    ("femnist", "iadmm", math.inf): [(37.27, "003, non-private"), (35.25, "000, non-private")],
    ("mnist", "objpm", 0.05): [(11.74, "003, best of 10")],
    ("mnist", "outp", 0.05): [(21.79, "003, best of 10")],
    ("femnist", "objpm", 0.05): [(59.42, "003, best of 10")],
    ("femnist", "outp", 0.05): [(91.05, "003, best of 10")],
    ("mnist", "objt", 5.0): [(7.84, "000")],
    ("femnist", "objt", 5.0): [(36.29, "000")],
    ("mnist", "objt", 0.05): [(12.80, "000")],
    ("femnist", "objt", 0.05): [(72.40, "000")],
}


@dataclass(frozen=True)
class GridConfig:
    """What ``dpadmm reproduce`` runs; the defaults are the papers' full grid."""

    out: str = "reproduce"
    datasets: tuple[str, ...] = PAPER_DATASETS
    algorithms: tuple[str, ...] = ALGORITHMS
    eps: tuple[float, ...] = PAPER_EPS
    trust_radii: tuple[str, ...] = TRUST_RADII  # one objt cell per radius
    iadmm_steps: tuple[int, ...] = (1, 10)  # one iadmm cell per E
    seeds: int = PAPER_SEEDS
    rounds: int = PAPER_ROUNDS
    eval_every: int = 0  # 0: about 100 evaluations per run
    mnist_dir: str = ""  # empty: the download cache (dpadmm.data.download)
    femnist_dir: str = ""
    dtype: str = "float32"
    device: str = "cpu"
    delta: float = 1e-5

    def __post_init__(self) -> None:
        for name, values, allowed in (("datasets", self.datasets, PAPER_DATASETS),
                                      ("algorithms", self.algorithms, ALGORITHMS),
                                      ("trust-radii", self.trust_radii, TRUST_RADII)):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise ValueError(f"{name}={','.join(values)!r} is not allowed; "
                                 f"choose among {', '.join(allowed)}")
        if not self.iadmm_steps or any(e < 1 for e in self.iadmm_steps):
            raise ValueError(f"iadmm-steps={','.join(map(str, self.iadmm_steps))!r} is not allowed; give "
                             "local step counts >= 1")
        if not self.eps or any(not (e > 0 and math.isfinite(e)) for e in self.eps):
            raise ValueError(f"eps={self.eps!r} is not allowed; give finite eps-bar values > 0")
        if self.seeds < 1 or self.rounds < 1 or self.eval_every < 0:
            raise ValueError(f"seeds={self.seeds}, rounds={self.rounds} must be >= 1 and eval-every="
                             f"{self.eval_every} >= 0")
        if self.dtype not in DTYPES or self.device not in DEVICES:
            raise ValueError(f"dtype={self.dtype!r} / device={self.device!r}: choose {DTYPES} / {DEVICES}")

    def cells(self) -> list[RunConfig]:
        """One configuration per cell, in run order."""
        if "femnist" in self.datasets and not self.femnist_dir:
            raise ValueError("the femnist cells need --femnist-dir: LEAF sample folders, "
                             "e.g. ../shared/data/femnist")
        every = self.eval_every or max(1, self.rounds // 100)
        out = []
        for dataset in self.datasets:
            for algorithm in self.algorithms:
                variants: list[dict[str, Any]] = [{}]
                if algorithm == "objt":
                    variants = [{"trust_radius": r} for r in self.trust_radii]
                elif algorithm == "iadmm":  # E = 1 is iadmm's default: its cells keep their settings
                    variants = [{"local_steps": e} if e != 1 else {} for e in self.iadmm_steps]
                for variant in variants:
                    for eps in ([math.inf] if algorithm == "iadmm" else self.eps):
                        out.append(papers(
                            algorithm=algorithm, epsilon=eps, rounds=self.rounds, dataset=dataset,
                            data_dir=self.mnist_dir if dataset == "mnist" else self.femnist_dir,
                            dtype=self.dtype, device=self.device, eval_every=every,
                            sensitivity=SENSITIVITY, delta=self.delta, **variant,
                        ))
        return out


def algorithm_label(config: RunConfig) -> str:
    """The algorithm and the open setting that tells its cells apart: ``objt-reference`` (the authors'
    code's constant trust radius), ``iadmm-E10`` (non-private with E = 10); the papers' reading keeps the
    bare name, so cells run before these settings existed keep their names."""
    if config.algorithm == "objt" and config.trust_radius != "paper":
        return f"objt-{config.trust_radius}"
    if config.algorithm == "iadmm" and config.steps != 1:
        return f"iadmm-E{config.steps}"
    return config.algorithm


def cell_name(config: RunConfig) -> str:
    eps = "inf" if not config.private else f"{config.epsilon:g}"
    return f"{config.dataset}-{algorithm_label(config)}-eps{eps}"


def _identity(config: RunConfig, seeds: Sequence[int]) -> dict[str, Any]:
    """What must match for a cell on disk to be this cell (data folders may move)."""
    from dpadmm.runs.results import json_value

    mapping = {k: json_value(v) for k, v in config.to_mapping().items() if k not in ("data-dir", "out")}
    return {"config": mapping, "seeds": list(seeds)}


def run_grid(grid: GridConfig, options: GridOptions | None = None, *,
             log: Callable[[str], None] = print) -> Path:
    """Run every cell not yet complete (:mod:`dpadmm.runs.grid`: here, or on Ray with ``options``),
    rebuilding the report after each; returns the folder. Raises :class:`dpadmm.runs.grid.CellsFailed`
    at the end if cells failed (the others are complete and reported)."""
    out = Path(grid.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    seeds = list(range(grid.seeds))
    cells = [_cell(out, config, seeds if config.private else seeds[:1]) for config in grid.cells()]
    log(f"reproduce: {len(cells)} cells x {len(seeds)} seeds, T={grid.rounds}, {grid.dtype} on "
        f"{grid.device}, into {out}")
    log("reproduce: sensitivity=data-dependent, the papers' eq. (9b) calibration, so the runs match theirs; "
        "Theorem 1 does not cover it and the privacy columns are nominal (dpadmm train defaults to clipped)")
    with GridRunner(out, options or GridOptions(), log=log) as runner:
        runner.run(cells, functools.partial(_commit, out, grid.delta))
    write_report(out, grid.delta)
    runner.raise_failures()
    return out


def _cell(out: Path, config: RunConfig, seeds: list[int]) -> Cell:
    """The grid cell of ``config``: complete when its folder holds cell.json with the same settings (another
    cell's settings there are an error: never overwritten)."""
    name = cell_name(config)
    identity = _identity(config, seeds)
    done = out / "runs" / name / "cell.json"
    if done.exists():
        recorded = json.loads(done.read_text())
        # a cell recorded before a key existed ran with that key's default
        recorded["config"] = {**_identity(papers(), [])["config"], **recorded["config"]}
        if not config.private:  # recorded before non-private cells ran one seed: the same run
            recorded["seeds"] = recorded["seeds"][:1]
        if {k: recorded[k] for k in identity} != identity:
            raise ValueError(f"{done.parent} holds this cell with other settings ({recorded['config']}, "
                             f"seeds {recorded['seeds']}); use another --out or delete that folder")
    return Cell(key=name, run=functools.partial(_run_cell, config, seeds), folder=f"runs/{name}",
                checkpoint=CHECKPOINT, done=done.exists(),
                progress=functools.partial(_rounds_done, config.rounds),
                gpus=1.0 if config.device == "cuda" else 0.0, identity=identity)


CHECKPOINT = "checkpoint.pt"


def _run_cell(config: RunConfig, seeds: list[int], workspace: Workspace) -> dict[str, Any]:
    """One cell: its seeds as one batch of the engine, in the workspace (resuming from its checkpoint)."""
    import torch

    from dpadmm.iadmm import engine
    from dpadmm.iadmm.federation import load_for

    started = time.perf_counter()
    engine.run_seeds(config, seeds, progress=False, directories=[workspace.path / f"seed-{s}" for s in seeds],
                     checkpoint=workspace.path / CHECKPOINT, checkpoint_seconds=workspace.checkpoint_seconds)
    (workspace.path / CHECKPOINT).unlink(missing_ok=True)
    return {**_identity(config, seeds), "wall_seconds_last_call": round(time.perf_counter() - started, 1),
            "training_samples": load_for(config).num_train, "machine": machine(),
            "threads": torch.get_num_threads()}


def _rounds_done(rounds: int, folder: Path) -> str:
    """How far a running cell is: the last evaluated round of its first seed, of ``rounds``."""
    logs = sorted(folder.glob("seed-*/metrics.jsonl"))
    lines = logs[0].read_text(encoding="utf-8").splitlines() if logs else []
    last = json.loads(lines[-1])["round"] if lines and lines[-1].endswith("}") else 0
    return f"{last}/{rounds}"


def _commit(out: Path, delta: float, cell: Cell, result: dict[str, Any]) -> None:
    """A completed cell: cell.json (its settings, seeds and wall time), then the report."""
    record = {**result, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / cell.folder / "cell.json").write_text(json.dumps(record, indent=2) + "\n")
    write_report(out, delta)


def estimate(grid: GridConfig) -> Estimate:
    """The wall time of the cells of ``grid`` not yet complete in ``grid.out``, before any runs: each kind
    of cell (data set, algorithm, E, private or not: what a round costs) runs a few rounds with the cell's
    seeds (:mod:`dpadmm.runs.estimate`); a cell costs T of its rounds and its evaluations. At the papers'
    defaults (T = 20,000, 10 seeds) that is days on a laptop's CPU: the caller says so before starting."""
    from dpadmm.iadmm import engine

    seeds = list(range(grid.seeds))
    units = []
    for config in grid.cells():
        if (Path(grid.out) / "runs" / cell_name(config) / "cell.json").exists():
            continue
        cell_seeds = seeds if config.private else seeds[:1]

        def run(k: int, config: RunConfig = config, cell_seeds: list[int] = cell_seeds
                ) -> list[dict[str, Any]]:
            probe = dataclasses.replace(config, rounds=k, eval_every=1)
            return engine.run_seeds(probe, cell_seeds, write=False, progress=False)[0].records

        units.append(Unit(key=(config.dataset, config.algorithm, config.steps, config.private),
                          iterations=config.rounds, evaluations=evaluations(config.rounds, config.eval_every),
                          probe=run))
    return estimate_units(units, excluded="the report and figures rebuilt after each cell (seconds each)")


def machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}, {os.cpu_count()} CPU cores, {gpu}, torch {torch.__version__}"


# ----- the report -----


def completed_cells(out: Path) -> list[tuple[RunConfig, dict[str, Any], Path]]:
    """(configuration, cell.json, folder) of every completed cell under out/runs."""
    found = []
    for done in sorted((out / "runs").glob("*/cell.json")):
        record = json.loads(done.read_text())
        seed_dir = done.parent / f"seed-{record['seeds'][0]}"
        config = RunConfig.from_mapping(_config_of(seed_dir))
        found.append((config, record, done.parent))
    return found


def _config_of(run_dir: Path) -> dict[str, Any]:
    header = json.loads((run_dir / "config.json").read_text())
    header.pop("engine", None)
    return header


def collect(out: Path) -> list[dict[str, Any]]:
    """One row per data set x algorithm x eps x seed x evaluated round, from the completed cells."""
    rows = []
    for config, record, folder in completed_cells(out):
        for seed in record["seeds"]:
            with open(folder / f"seed-{seed}" / "metrics.jsonl", encoding="utf-8") as fh:
                for line in fh:
                    m = json.loads(line)
                    rows.append({
                        "dataset": config.dataset, "algorithm": algorithm_label(config),
                        "eps": config.effective_epsilon, "local_steps": config.steps,
                        "rounds": config.rounds, "seed": seed, "round": m["round"],
                        "test_error": m["test-error"], "train_loss": m["train-loss"],
                        "consensus_violation": m["consensus-violation"],
                        "noise_magnitude": m["noise-magnitude"], "rho": m["rho"], "seconds": m["seconds"],
                    })
    return rows


def write_report(out: Path, delta: float = 1e-5) -> None:
    """results.csv, summary.md and the figures, from every completed cell in ``out``."""
    rows = collect(out)
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    (out / "summary.md").write_text(summary(out, rows, delta))
    if rows:
        from dpadmm.iadmm import figures  # matplotlib, only when there is something to draw

        figures.draw_all(rows, final_errors(rows), out)


def final_errors(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str, float], list[float]]:
    """Test error at each run's last round, per (dataset, algorithm label, eps)."""
    last: dict[tuple[str, str, float, int], tuple[int, float]] = {}
    for r in rows:
        key = (r["dataset"], r["algorithm"], r["eps"], r["seed"])
        if key not in last or r["round"] > last[key][0]:
            last[key] = (r["round"], r["test_error"])
    grouped: dict[tuple[str, str, float], list[float]] = {}
    for (dataset, algorithm, eps, _), (_, error) in sorted(last.items()):
        grouped.setdefault((dataset, algorithm, eps), []).append(error)
    return grouped


def _eps(value: float) -> str:
    return "non-private" if math.isinf(value) else f"{value:g}"


def _ledger_cells(folder: Path, seed: int) -> str:
    """Per step, per round and whole-run PLD epsilon from the run's own privacy.json."""
    path = folder / f"seed-{seed}" / "privacy.json"
    if not path.exists():
        return "none | none | none"
    ledger = json.loads(path.read_text())
    return " | ".join(f"{ledger[k]['epsilon_pld']:.3g}" for k in ("per_step", "per_round", "whole_run"))


def summary(out: Path, rows: list[dict[str, Any]], delta: float) -> str:
    import numpy as np

    from dpadmm.iadmm.federation import load_for

    cells = completed_cells(out)
    errors = final_errors(rows)
    lines = [
        "# Reproduction of Ryu & Kim's experiments",
        "",
        "Generated by `dpadmm reproduce` from the completed cells in this folder. Test error (%) at each "
        "run's last round: mean, 20th and 80th percentile and best over the seeds, next to the papers' "
        "numbers (T = 20,000). Privacy: epsilon at delta = "
        f"{delta:g} per agent by dp-accounting's PLD accountant, per local step / per round (E steps) / "
        "whole run (T rounds). The runs use the papers' data-dependent sensitivity (eq. (9b)), which "
        "Theorem 1 does not cover: these privacy values are **nominal** (see the privacy section of "
        "docs/families/iadmm.md).",
        "",
    ]
    machines = sorted({record.get("machine", "?") for _, record, _ in cells})
    if machines:
        lines += [f"Hardware: {'; '.join(machines)}.", ""]
    # (data set, T) -> seed counts of its private cells, where T or the seeds fall short of the papers'
    # (a non-private cell's one seed stands for all: its runs do not depend on the seed)
    short: dict[tuple[str, int], set[int]] = {}
    for c, rec, _ in cells:
        if c.rounds < PAPER_ROUNDS or (c.private and len(rec["seeds"]) < PAPER_SEEDS):
            short.setdefault((c.dataset, c.rounds), set()).update([len(rec["seeds"])] if c.private else [])
    if short:
        fewer_rounds = any(t < PAPER_ROUNDS for _, t in short)
        parts = [f"{d.upper()}: T = {t:,}"
                 + (f" of the papers' {PAPER_ROUNDS:,} rounds" if t < PAPER_ROUNDS else "")
                 + (f", {'/'.join(map(str, sorted(n)))} of {PAPER_SEEDS} seeds" if n else "")
                 for (d, t), n in sorted(short.items())]
        lines += [
            ("**Shortened grid.** " if fewer_rounds else "**Fewer seeds.** ") + "; ".join(parts) + "."
            + (" Errors after fewer rounds than the papers' are above their T = 20,000 values and are not "
               "comparable to them; the comparison such rows allow is between algorithms at equal T."
               if fewer_rounds else "")
            + " The full grid is `" + FULL_COMMAND + "`.",
            "",
        ]
    if any(not c.private for c, _, _ in cells):
        lines += ["The non-private cells run seed 0 alone: without noise a run does not depend on its "
                  "seed.", ""]
    for dataset in PAPER_DATASETS:
        here = [(c, rec, folder) for c, rec, folder in cells if c.dataset == dataset]
        if not here:
            continue
        total = here[0][1].get("training_samples") or load_for(here[0][0]).num_train
        lines += [
            f"## {dataset.upper()} (P = {here[0][0].num_agents}, I = {total} training samples)",
            "",
            "| algorithm | eps-bar | E | T | seeds | mean | p20 | p80 | best | papers | eps per step "
            "| per round | whole run | wall (s)* |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for config, record, folder in sorted(here, key=lambda c: (algorithm_label(c[0]),
                                                                  c[0].effective_epsilon)):
            label = algorithm_label(config)
            errs = 100 * np.asarray(errors.get((dataset, label, config.effective_epsilon), [math.nan]))
            papers = PAPER_RESULTS.get((dataset, config.algorithm, config.effective_epsilon), [])
            quoted = "; ".join(f"{v:.2f} ({src})" for v, src in papers) or "-"
            lines.append(
                f"| {label} | {_eps(config.effective_epsilon)} | {config.steps} | {config.rounds} "
                f"| {len(record['seeds'])} | {errs.mean():.2f} | {np.percentile(errs, 20):.2f} "
                f"| {np.percentile(errs, 80):.2f} | {errs.min():.2f} | {quoted} "
                f"| {_ledger_cells(folder, record['seeds'][0])} "
                f"| {record.get('wall_seconds_last_call', '?')} |"
            )
        wall = sum(float(record.get("wall_seconds_last_call", 0)) for _, record, _ in here)
        lines += ["", f"\\* wall time of the call that completed the cell, all its seeds together; "
                      f"{wall / 60:.1f} minutes for the {len(here)} cells above.", ""]
    lines += [
        "Figures: `fig1-test-error.png` (test error against round, mean with the 20-80 percentile band, "
        "003 Fig. 1), `fig2-best-error-vs-eps.png` (best test error against eps-bar, 003 Fig. 2), "
        "`fig3-noise.png` (mean noise magnitude against round, 003 Fig. 3), `fig5-consensus.png` "
        "(consensus violation against round, 000 Fig. 5).",
        "",
        *references.section(REFERENCES),
        "",
    ]
    return "\n".join(lines)


def grid_from_args(**kwargs: Any) -> GridConfig:
    """A GridConfig from CLI values (comma-separated lists as strings)."""
    fields = {f.name for f in dataclasses.fields(GridConfig)}
    values: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key not in fields or value is None:
            continue
        if key in ("datasets", "algorithms", "trust_radii"):
            value = tuple(v.strip() for v in value.split(",") if v.strip())
        elif key == "iadmm_steps":
            try:
                value = tuple(int(v) for v in value.split(",") if v.strip())
            except ValueError:
                raise ValueError(f"iadmm-steps={value!r} is not allowed; give comma-separated "
                                 "integers") from None
        elif key == "eps":
            try:
                value = tuple(float(v) for v in value.split(",") if v.strip())
            except ValueError:
                raise ValueError(f"eps={value!r} is not allowed; give comma-separated numbers") from None
        values[key] = value
    return GridConfig(**values)
