"""The main job's step, measured: test error for the rule's a and rho and for other choices, per model.

DP-IADMM's local step has two knobs, the proximal scale a (eta^t = a / sqrt(t)) and the penalty rho. The
main job sets them by a rule (``dpadmm.iadmm.config.RunConfig.scale``, ``rho-preset=main``,
``dpadmm.iadmm.schedules.noise_damping``) instead of a search. This script trains each model under the
main job (budget-first, the whole run (8, 1e-5)-DP per agent, Gaussian noise, C = 1, q = 0.2, T = 10 rounds
of E = 10 steps) with the rule and with a few other (a, rho), and writes what each reached:

- ``logistic``: the papers' model on the embedded 5,000-image MNIST sample, 10 agents;
- ``digits-mlp``: the task of ``examples/digits_app``, a 64-32-10 ReLU MLP on scikit-learn's 8 x 8 digits
  (1,437 training and 360 test images, a fixed shuffle), 5 agents: the kind of app a Flower user plugs the
  strategy into;
- ``mlp``: dpadmm's ``model=mlp`` (784-64-10) on the embedded sample, 10 agents;
- ``tiny-cnn``: the plug-in example's ``TinyCNN`` (about 2,000 parameters) on the embedded sample, 4 agents;
- ``cnn``: the LEAF CNN (6.6 M parameters) on the embedded sample, 10 agents (about 9 minutes a run on 2
  cores; ``--models`` leaves it out).

Rows: ``rule`` (seeds 0, 1, 2), and with seed 0: ``rate R`` for R = 1 and 16 (a = R (1 + s) P / C, rho =
s / a with the rule's share s = ``PULL_SHARE``: the rule's form at another rate, without the damping).
The CNN: ``rule`` and ``rate 4`` (the rule's largest rate, without its damping), seed 0. Every run is
appended to ``runs.jsonl`` in ``--out`` and skipped by a later call; ``table.md`` is written from all of
them. The model study (``python -m benchmarks.compare_dp``, docs/results/models) measures the rule at eps
1 to 8 against tuned steps and tuned DP-SGD + FedAvg.

Usage, from the project root::

    python -m benchmarks.step_rule [--models logistic,digits-mlp,mlp,tiny-cnn,cnn]
        [--out docs/results/step-rule]

Its data (the embedded sample, scikit-learn's digits) ship with dpadmm and scikit-learn: no data folder is
needed. A benchmark script, not a test.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import ArgumentParser, check_folder
from dpadmm.data import Dataset, load_dataset
from dpadmm.iadmm import engine, schedules
from dpadmm.iadmm.config import PULL_SHARE, RunConfig, main_job
from dpadmm.runs import references as bibliography

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("logistic", "digits-mlp", "mlp", "tiny-cnn", "cnn")
REFERENCES = ("003", "abadi2016")  # the algorithm, and the DP-SGD step the rule mimics
RATES = (1.0, 16.0)  # the rule's form at a quarter and at four times its rate
SEEDS = (0, 1, 2)


def digits() -> tuple[Dataset, nn.Module]:
    """The digits example's task (``examples/digits_app``): its data (as float64, like the other data sets)
    and its 64-32-10 MLP."""
    sys.path.insert(0, str(ROOT / "examples" / "digits_app"))
    from digits_app.task import Net, data

    x, y, x_test, y_test = data()
    return Dataset("digits", x.double(), y, x_test.double(), y_test, 10), Net()


def setting(model: str) -> tuple[RunConfig, Dataset, nn.Module | None]:
    """The main job for ``model``: its configuration, data and module (None: built from the config)."""
    base = dataclasses.replace(main_job(), dtype="float32")
    if model == "digits-mlp":
        return dataclasses.replace(base, model="custom", num_agents=5), *digits()
    if model == "tiny-cnn":
        sys.path.insert(0, str(ROOT / "examples" / "plugin_app"))
        from plugin_app.model import TinyCNN

        return dataclasses.replace(base, model="custom", num_agents=4), load_dataset("default"), TinyCNN()
    per_sample = "factorized" if model == "cnn" else "vmap"
    return dataclasses.replace(base, model=model, per_sample=per_sample), load_dataset("default"), None


def choices(model: str, config: RunConfig) -> list[tuple[str, dict[str, Any], tuple[int, ...]]]:
    """(row label, the keys it sets, its seeds)."""
    large = model == "cnn"  # minutes a run: the rule once, and the rule's rate without its damping
    rows: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [("rule", {}, (0,) if large else SEEDS)]
    if model == "logistic":
        return rows
    for rate in ((4.0,) if large else RATES):
        a = rate * (1 + PULL_SHARE) * config.num_agents / config.clip_norm
        rows.append((f"rate {rate:g}", {"prox_scale": a, "rho_preset": "custom", "rho_c1": PULL_SHARE / a,
                                        "rho_c2": 0.0}, (0,)))
    return rows


def measure(model: str, label: str, keys: dict[str, Any], seed: int) -> dict[str, Any]:
    config, data, module = setting(model)
    config = dataclasses.replace(config, **keys, seed=seed)
    started = time.perf_counter()
    result = engine.run(config, dataset=data, module=module, write=False, progress=False)
    run = result.config  # calibrated
    first = result.records[0]
    params = sum(v.numel() for v in result.model.values()) if isinstance(result.model, dict) else \
        result.model.numel()
    return {"model": model, "row": label, "seed": seed, "a": run.scale, "rho": schedules.rho_at(run, 1),
            "parameters": params, "test-error": [r["test-error"] for r in result.records],
            "train-loss": result.records[-1]["train-loss"], "first-train-loss": first["train-loss"],
            "seconds": time.perf_counter() - started}


def table(runs: list[dict[str, Any]]) -> str:
    lines = ["| model | parameters | step | a | rho | test error after round 10 | train loss |",
             "| --- | ---: | --- | ---: | ---: | --- | ---: |"]
    for model in MODELS:
        for label in dict.fromkeys(r["row"] for r in runs if r["model"] == model):
            group = [r for r in runs if r["model"] == model and r["row"] == label]
            errors = [r["test-error"][-1] for r in group]
            error = (f"{statistics.mean(errors):.3f} +- {statistics.stdev(errors):.3f} ({len(errors)} seeds)"
                     if len(errors) > 1 else f"{errors[0]:.3f}")
            loss = statistics.mean(r["train-loss"] for r in group)
            a = "rule" if label == "rule" else f"{group[0]['a']:.4g}"
            lines.append(f"| {model} | {group[0]['parameters']:,} | {label} | {a} | {group[0]['rho']:.3g} | "
                         f"{error} | {loss:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.step_rule", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="logistic,digits-mlp,mlp,tiny-cnn")
    parser.add_argument("--out", default="docs/results/step-rule")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown or not models:
        parser.error(f"--models {','.join(unknown)} is not allowed; choose from {', '.join(MODELS)}")
    out = Path(args.out)
    check_folder(parser, "--out", out)
    log = out / "runs.jsonl"
    try:
        runs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    except (OSError, ValueError) as error:
        parser.error(f"--out {out}: {log} is not this script's runs.jsonl ({error})")
    out.mkdir(parents=True, exist_ok=True)
    done = {(r["model"], r["row"], r["seed"]) for r in runs}
    for model in models:
        config = setting(model)[0]
        for label, keys, seeds in choices(model, config):
            for seed in seeds:
                if (model, label, seed) in done:
                    continue
                record = measure(model, label, keys, seed)
                print(f"{model} {label} seed {seed}: test error {record['test-error'][-1]:.3f}, "
                      f"{record['seconds']:.0f} s", flush=True)
                with log.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                runs.append(record)
    (out / "table.md").write_text(
        "# The main job's step, measured\n\nGenerated by `python -m benchmarks.step_rule` on "
        f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}: the main job "
        "(eps = 8, delta = 1e-5 for the whole run per agent, T = 10, E = 10, q = 0.2, C = 1, float32), "
        f"seed 0 unless stated. Every model's untrained loss is about ln 10 = {math.log(10):.3f}.\n\n"
        + table(runs) + "\n" + "\n".join(bibliography.section(REFERENCES)) + "\n")
    print(f"wrote {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
