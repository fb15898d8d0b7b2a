"""What ADMM's global update costs DP-IADMM under noise: w^T against the agents' plain average.

Eq. (4a) of 003 (``dpadmm.iadmm.consensus.global_update``) sets
w^{t+1} = mean_p z_p^t - mean_p lambda_p^t / rho, and the dual update (4c) adds rho (w - z_p) to
lambda_p every round. Averaged over agents, with a constant rho and the zero start, the two make
w^{t+1} = 2 zbar^t - zbar^{t-1} (zbar: the agents' average release; mean lambda^t / rho =
zbar^{t-1} - zbar^t by induction), whatever the value of rho: an extrapolation of the averaged
releases, which speeds training up where the releases carry little noise and adds noise where they
carry much. FedAvg's global model is zbar itself.

For each data set and epsilon of the comparison (``docs/results/compare``), this trains the configuration
the tuning chose, with the reported seeds, and scores on the test half three models computed from the same
run's releases (post-processing: the same privacy):

- ``w^T``: what DP-IADMM releases and the comparison reports;
- ``zbar^{T-1}``: the plain average of the releases w^T is computed from (the run stopped one round early);
- ``zbar^T``: the plain average of all T rounds' releases;
- ``zlast^T``: the plain average of the agents' last local iterates z_p^{T,E+1}. A round sends the
  average of its E iterates, but the ledger counts every local iterate as a release (Theorem 1 makes
  each one eps-bar-DP), so this too is post-processing under the same guarantee: it measures what
  releasing the last iterate, as DP-SGD does, instead of the average would give.

On the heterogeneity axis (``compare_dp.HETEROGENEOUS``) it also tables what the tuning measured about
the two drift corrections, from the tuning runs alone (seed 0, validation half; no new training): DP-IADMM's
best error over its step sizes a for each rho and local start (rho = 1e-2 binds, 1e-4 barely), and
DP-FedProx's for each mu beside DP-SGD + FedAvg's (mu = 0) on the same rate q and learning rates.

Usage, from the project root (after ``python -m benchmarks.compare_dp``, whose runs.jsonl it reads):

    python -m benchmarks.compare_dp_terms [--out docs/results/compare] [--seeds 1,2,3] [--threads 1]

It writes ``terms.md`` there (about 5 minutes on 2 cores). It reads each data set where compare_dp does
(../shared/data/<name> where that folder exists, else dpadmm's cache, which ``dpadmm data fetch NAME``
fills) and stops in one line, before any training, when one is in neither. A benchmark script, not a test.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import ArgumentParser, check_file, number_list, positive_int
from benchmarks.compare_dp import (
    DATASETS,
    GRIDS,
    HETEROGENEOUS,
    HETEROGENEOUS_GRID,
    Context,
    Result,
    add_data_arguments,
    current_runs,
    errors,
    iadmm_config,
    load_context,
    load_runs,
    require_settings_data,
)
from dpadmm.iadmm import engine
from dpadmm.runs import references

MODELS = ("w^T", "zbar^{T-1}", "zbar^T", "zlast^T")
REFERENCES = ("003",)  # what terms.md cites (dpadmm.runs.references): the models are 003's


def measure(ctx: Context, params: dict, epsilon: float, seeds: list[int]) -> dict[str, list[float]]:
    """Test-half errors (%) of the three models, per seed."""
    config = iadmm_config(ctx, params, epsilon)
    full = engine.run_seeds(config, seeds, dataset=ctx.data, write=False, progress=False)
    shorter = dataclasses.replace(config, rounds=config.rounds - 1, eval_every=config.rounds - 1)
    early = engine.run_seeds(shorter, seeds, dataset=ctx.data, write=False, progress=False)
    out: dict[str, list[float]] = {name: [] for name in MODELS}
    for last, before in zip(full, early, strict=True):
        models = (last.state.w, before.state.z.mean(dim=0), last.state.z.mean(dim=0),
                  last.state.z_chain.mean(dim=0))
        for name, w in zip(MODELS, models, strict=True):
            out[name].append(100 * errors(ctx, {"weight": w})["test-error"])
    return out


def _best(runs: list[Result], **fixed: Any) -> str:
    """The lowest validation error (%) of the tuning runs whose parameters hold ``fixed`` (a missing
    ``local_start`` is the papers' chain), or "-" when none does."""
    def holds(run: Result) -> bool:
        params = {"local_start": "chain", **run["params"]}
        return all(params.get(key, 0.0) == value for key, value in fixed.items())

    chosen = [r["val-error"] for r in runs if holds(r)]
    return f"{100 * min(chosen):.2f}" if chosen else "-"


def correction_lines(runs: list[Result]) -> list[str]:
    """What the tuning measured about the drift corrections on the heterogeneity axis: per partition and
    eps, the best validation error over the step sizes for each strength of the correction."""
    tuned = [r for r in runs if r["phase"] == "tune" and r["dataset"] in HETEROGENEOUS]
    if not tuned:
        return []
    rhos = sorted({p["rho_c1"] for p in HETEROGENEOUS_GRID["dpiadmm"]})
    mus = sorted({p["prox_mu"] for p in HETEROGENEOUS_GRID["dpfedprox"]})
    rates = sorted({p["sample_rate"] for p in HETEROGENEOUS_GRID["dpfedprox"]})
    lrs = sorted({p["lr"] for p in HETEROGENEOUS_GRID["dpfedprox"]})
    starts = ("global", "chain")
    rate_list, lr_list = ", ".join(f"{q:g}" for q in rates), ", ".join(f"{lr:g}" for lr in lrs)
    lines = ["## The drift corrections in the tuning (heterogeneous partitions)", "",
             "Validation error (%) of the tuning runs (seed 0), the best over the step sizes, for each "
             "strength of the correction. DP-IADMM: rho^t = rho (eq. (8) moves a local step towards w with "
             "weight rho / (1/eta + rho); the dual (4c) accumulates rho (w - z_p)), local steps from w "
             "(global) or from the agent's chain; best over a. DP-FedProx: the proximal weight mu, at q = "
             f"{rate_list}, best over lr in {{{lr_list}}}; "
             "mu = 0 is DP-SGD + FedAvg's runs at the same q and learning rates.", "",
             "| partition | eps | " + " | ".join(f"rho {rho:g}, {start}" for rho in rhos for start in starts)
             + " | " + " | ".join(f"mu {mu:g}" for mu in (0.0, *mus)) + " |",
             "| --- | --- |" + " --- |" * (len(rhos) * len(starts) + len(mus) + 1)]
    for dataset in HETEROGENEOUS:
        ours = [r for r in tuned if r["dataset"] == dataset]
        for eps in sorted({r["epsilon"] for r in ours}):
            at = [r for r in ours if r["epsilon"] == eps]
            iadmm = [_best([r for r in at if r["method"] == "dpiadmm"], rho_c1=rho, local_start=start)
                     for rho in rhos for start in starts]
            prox = [_best([r for r in at if r["method"] == "dpsgd" and r["params"]["sample_rate"] in rates
                           and r["params"]["lr"] in lrs])]
            prox += [_best([r for r in at if r["method"] == "dpfedprox"], prox_mu=mu) for mu in mus]
            lines.append(f"| {HETEROGENEOUS[dataset]} | {eps:g} | " + " | ".join(iadmm + prox) + " |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m benchmarks.compare_dp_terms",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/compare",
                        help="the folder of compare_dp's runs.jsonl, where terms.md is written")
    parser.add_argument("--seeds", default="1,2,3")
    add_data_arguments(parser)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args(argv)
    out = Path(args.out)
    seeds = number_list(parser, "--seeds", args.seeds, int, lambda s: s >= 0, "seeds (integers >= 0)")
    try:
        current = current_runs(list(load_runs(out / "runs.jsonl").values()), GRIDS)
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"--out {out}: its runs.jsonl is not compare_dp's ({error})")
    chosen = {(r["dataset"], r["epsilon"]): r["params"] for r in current
              if r["method"] == "dpiadmm" and r["phase"] == "report"}
    if not chosen:
        parser.error(f"no DP-IADMM report runs in {out / 'runs.jsonl'}; run benchmarks.compare_dp first")
    check_file(parser, "--out", out / "terms.md")
    require_settings_data(parser, dict.fromkeys(d for d, _ in chosen), args)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    lines = ["# What ADMM's global update costs under noise", "",
             "Generated by `python -m benchmarks.compare_dp_terms` (its docstring explains the models). Test "
             "error (%) on the test half, mean +- standard deviation over seeds "
             f"{', '.join(map(str, seeds))}, of three models computed from the same DP-IADMM runs: w^T "
             "(eq. (4a), what DP-IADMM releases), zbar^{T-1} (the plain average of the releases w^T is "
             "computed from), zbar^T (the plain average of the last round's releases) and zlast^T (the "
             "plain average of the agents' last local iterates, each a release the ledger counts).", "",
             "| data set | eps | chosen configuration | " + " | ".join(MODELS) + " |",
             "| --- | --- | --- |" + " --- |" * len(MODELS)]
    for dataset in DATASETS:
        keys = sorted(e for d, e in chosen if d == dataset)
        if not keys:
            continue
        ctx = load_context(dataset, args, out)
        for eps in keys:
            params = chosen[(dataset, eps)]
            result = measure(ctx, params, eps, seeds)
            cells = [f"{statistics.fmean(v):.2f} +- {statistics.stdev(v) if len(v) > 1 else 0.0:.2f}"
                     for v in result.values()]
            described = ", ".join(f"{k}={v}" for k, v in params.items())
            lines.append(f"| {dataset} | {eps:g} | {described} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    lines += ["", f"Wall time: {(time.perf_counter() - started) / 60:.1f} min on this machine.", "",
              *correction_lines(current), *references.section(REFERENCES), ""]
    (out / "terms.md").write_text("\n".join(lines))
    print(f"wrote {out / 'terms.md'}")


if __name__ == "__main__":
    main()
