"""The engine's module path: vmap over agents against a plain loop over agents (s/round, peak memory).

Each variant runs ``dpadmm.iadmm.engine.step`` (w, every agent's E local steps with their noise,
the duals; no central evaluation) in a fresh subprocess, so that its peak resident memory
(``VmHWM`` of /proc/self/status, reset with /proc/self/clear_refs once the data and the
state are built) is its own. The variants:

- ``vmap``: the default, ``vectorize=True``: the agents' per-sample gradients under one
  ``vmap`` per chunk of agents (``oracles.PER_SAMPLE_BUDGET`` elements at a time);
- ``loop``: ``vectorize=False``: one agent after the other (each agent's samples still
  under ``vmap``);
- ``factorized``: ``per-sample=factorized`` (Linear and Conv2d layers only: norms from the
  layers' inputs and output gradients, no per-sample weight gradients), for comparison;
- ``closed form``: the logistic-regression fast path (``model=logistic``), for comparison;
- ``+ keep``: the same with glibc told to keep freed memory (``MALLOC_MMAP_MAX_=0``,
  ``MALLOC_TRIM_THRESHOLD_``), which shows what the page faults of fresh large
  allocations cost (``--malloc-keep``).

Cases: (a) the MLP (784-64-K) on the embedded MNIST sample with P = 10 and on FEMNIST with
P = 195; (b) the LEAF CNN on FEMNIST with a minibatch of 16 (float32, one round): every
agent does the same work, so a federation of the first 10 writers is timed and the round
of all 195 is extrapolated (x 19.5; the state of 195 agents alone is 195 x 6.6 M x 4 B per
copy, 10 GB for z and lambda, more than this benchmark should take from a shared machine);
(c) logistic regression as a module against the closed-form fast path (P = 10, E = 10).

``--budget-sweep`` instead times one ``ModuleOracle.gradient`` call (the per-sample gradients
of all P = 10 agents of the embedded data, clipped and summed) for logistic regression and
the MLP at several ``oracles.PER_SAMPLE_BUDGET`` values, vmap and loop, with and without
glibc keeping freed memory: the minimum of ``--repeats`` calls, interleaved.

Usage, from the project root:
    python -m benchmarks.engine_modules [--quick] [--rounds N] [--malloc-keep] [--markdown FILE]
        [--femnist-dir DIRS] [--cases a,b,c]
    python -m benchmarks.engine_modules --budget-sweep [--repeats N]
Prints a Markdown table. Not a test. Cases (a) and (b) read FEMNIST: by default ../shared/data/femnist's two
LEAF samples where that folder exists, else dpadmm's cache (``dpadmm data fetch femnist``: one sample, 114
writers, too few for case (a)'s P = 195); the script stops in one line, before any variant runs, when the
writers are not there. Case (c) and ``--budget-sweep`` read the embedded sample and need no folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import (
    ArgumentParser,
    check_file,
    data_dir,
    positive_int,
    require_data,
    shared_data,
)
from dpadmm.iadmm import engine
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.models.modules import LogisticRegression, build_model, initial_parameters

ROOT = Path(__file__).resolve().parents[1]
CASES = ("a", "b", "c")
FEMNIST_WRITERS = {"a": 195, "b": 10}  # the writers each FEMNIST case reads


def default_femnist() -> str:
    """The FEMNIST samples cases (a) and (b) read by default: the development machine's two LEAF samples
    (../shared/data/femnist, as the numbers in docs/benchmarks.md were measured), else dpadmm's cache."""
    shared = shared_data() / "femnist"
    if shared.is_dir():
        return ",".join(str(shared / sample) for sample in ("leaf-sample-a", "leaf-sample-b"))
    return str(data_dir("femnist"))


# glibc: serve every allocation from the heap and never give freed memory back, so a large tensor
# freed in one step is reused by the next instead of being mapped (and zeroed page by page) again.
KEEP_FREED_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40),
                     "MALLOC_TOP_PAD_": str(2**28)}


def _status(key: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak measured is that of the rounds."""
    Path("/proc/self/clear_refs").write_text("5")


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``spec``'s rounds of engine.step in this process; seconds, faults and memory per round."""
    torch.manual_seed(0)
    config = papers(**spec["config"])
    dataset = load_for(config)
    data = agent_data(dataset, config, range(config.num_agents))
    module = None
    if spec["model"] == "logistic-module":
        module = LogisticRegression(dataset.num_features, dataset.num_classes)
    elif config.model != "logistic":
        module = build_model(config.model, dataset.num_features, dataset.num_classes)
    if module is None:
        zeros = torch.zeros((1, config.num_agents, *data.shape), dtype=data.x.dtype)
        state = engine.EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(),
                                   lam=zeros.clone())
    else:
        w = initial_parameters(module, config.seed, dtype=data.x.dtype)
        z = {k: v.expand(config.num_agents, *v.shape).clone() for k, v in w.items()}
        z_chain = z if config.steps == 1 else {k: v.clone() for k, v in z.items()}
        lam = {k: torch.zeros_like(v) for k, v in z.items()}
        state = engine.EngineState(w=w, z=z, z_chain=z_chain, lam=lam)
    _reset_peak()
    baseline = _status("VmRSS")
    seconds, faults, system = [], [], []
    for t in range(1, spec["warmup"] + spec["rounds"] + 1):
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        engine.step(config, data, state, t, module=module, vectorize=spec["vectorize"])
        elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
        if t > spec["warmup"]:
            seconds.append(elapsed)
            faults.append(after.ru_minflt - before.ru_minflt)
            system.append(after.ru_stime - before.ru_stime)
    return {"seconds": sum(seconds) / len(seconds), "faults": sum(faults) / len(faults),
            "system": sum(system) / len(system), "peak": _status("VmHWM"), "baseline": baseline,
            "samples": int(data.counts.sum()), "padded": int(data.x.shape[0] * data.x.shape[1])}


def sweep(repeats: int) -> list[dict[str, Any]]:
    """Milliseconds (minimum of ``repeats``) and page faults of one gradient call, per model, budget and
    vectorize: the chunking of :meth:`ModuleOracle._sum` without the rest of the round."""
    from dpadmm.iadmm.local import oracle as make_oracle

    config = papers(epsilon=1.0, algorithm="objpm", model="custom")
    dataset = load_for(config)
    data = agent_data(dataset, config, range(config.num_agents))
    results = []
    shape = (dataset.num_features, dataset.num_classes)
    models = (("logistic regression", LogisticRegression(*shape)), ("MLP", build_model("mlp", *shape)))
    for name, module in models:
        w = initial_parameters(module, 0, dtype=data.x.dtype)
        z = {k: v.expand(config.num_agents, *v.shape).clone() + 0.01 for k, v in w.items()}
        oracles = {(budget, vectorize): make_oracle(config, data, module, vectorize=vectorize, budget=budget)
                   for budget in (2**21, 2**23, 2**26) for vectorize in (True, False)}
        best = dict.fromkeys(oracles, float("inf"))
        faults = dict.fromkeys(oracles, 0)
        for oracle in oracles.values():
            oracle.gradient(z, 1, 1)  # warm-up
        for _ in range(repeats):
            for key, oracle in oracles.items():
                before, started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                oracle.gradient(z, 1, 1)
                best[key] = min(best[key], time.perf_counter() - started)
                faults[key] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        results += [{"model": name, "budget": key[0], "vectorize": key[1], "ms": best[key] * 1e3,
                     "faults": faults[key] / repeats} for key in oracles]
    return results


def _run(spec: dict[str, Any], keep: bool) -> dict[str, Any]:
    """``measure(spec)`` in a fresh interpreter (its own peak memory and allocator settings)."""
    env = dict(os.environ, **(KEEP_FREED_MEMORY if keep else {}))
    done = subprocess.run([sys.executable, "-m", "benchmarks.engine_modules", "--child", json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"variant {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The (case, variant) specs to run, in order."""
    rounds, warmup = (1, 0) if args.quick else (args.rounds, 1)
    dtype = args.dtype
    femnist = {"dataset": "femnist", "data_dir": args.femnist_dir, "rho_preset": "femnist"}
    specs: list[dict[str, Any]] = []

    def add(case: str, variant: str, config: dict[str, Any], *, model: str = "", vectorize: bool = True,
            keep: bool = False, scale: float = 1.0, **timing: int) -> None:
        specs.append({"case": case, "variant": variant + (" + keep" if keep else ""), "keep": keep,
                      "config": {"epsilon": 1.0, "dtype": dtype, **config}, "model": model,
                      "vectorize": vectorize, "scale": scale, "rounds": timing.get("rounds", rounds),
                      "warmup": timing.get("warmup", warmup)})

    wanted = {c.strip() for c in args.cases.split(",")}
    if "a" in wanted:
        mlp = {"algorithm": "objpm", "local_steps": 2, "model": "mlp"}
        label = f"(a) MLP, embedded MNIST, P=10, ObjPM E=2, {dtype}"
        for keep in (False, True) if args.malloc_keep else (False,):
            add(label, "vmap", mlp, keep=keep)
            add(label, "loop", mlp, vectorize=False, keep=keep)
        add(label, "factorized", {**mlp, "per_sample": "factorized"})
        big = {"algorithm": "objp", "model": "mlp", "num_agents": 195, **femnist}
        label = f"(a) MLP, FEMNIST, P=195, ObjP E=1, {dtype}"
        add(label, "vmap", big, rounds=1)
        add(label, "loop", big, vectorize=False, rounds=1)
        add(label, "factorized", {**big, "per_sample": "factorized"}, rounds=1)
    if "b" in wanted:
        cnn = {"algorithm": "objp", "model": "cnn", "batch_size": 16, "num_agents": 10, "dtype": "float32",
               **femnist}
        label = "(b) LEAF CNN, FEMNIST, B=16, ObjP E=1, float32: 10 writers timed, x19.5 for P=195"
        add(label, "vmap", cnn, scale=19.5, rounds=1, warmup=0)
        add(label, "loop", cnn, vectorize=False, scale=19.5, rounds=1, warmup=0)
        add(label, "factorized", {**cnn, "per_sample": "factorized"}, scale=19.5, rounds=1, warmup=0)
    if "c" in wanted:
        lr = {"algorithm": "objpm", "local_steps": 10}
        label = f"(c) logistic regression, embedded MNIST, P=10, ObjPM E=10, {dtype}"
        add(label, "closed form", lr, model="logistic")
        for keep in (False, True) if args.malloc_keep else (False,):
            add(label, "vmap", {**lr, "model": "custom"}, model="logistic-module", keep=keep)
            add(label, "loop", {**lr, "model": "custom"}, model="logistic-module", vectorize=False, keep=keep)
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.engine_modules", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round per variant, no warm-up round")
    parser.add_argument("--rounds", type=positive_int, default=2, help="timed rounds after one warm-up round")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"),
                        help="dtype of cases (a) and (c); (b) is float32")
    parser.add_argument("--cases", default="a,b,c", help="comma-separated subset of a, b, c")
    parser.add_argument("--malloc-keep", action="store_true",
                        help="also run vmap and loop with glibc keeping freed memory (no page faults)")
    parser.add_argument("--femnist-dir", default=default_femnist(),
                        help="LEAF FEMNIST sample folders, comma-separated (default: the two samples of "
                             "../shared/data/femnist, else dpadmm's cache)")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--budget-sweep", action="store_true",
                        help="time one gradient call at several PER_SAMPLE_BUDGET values instead")
    parser.add_argument("--repeats", type=positive_int, default=5, help="calls per variant of --budget-sweep")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(sweep(spec["repeats"]) if "repeats" in spec else measure(spec)))
        return 0
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not wanted or set(wanted) - set(CASES):
        parser.error(f"--cases {args.cases!r}: give a comma-separated subset of {', '.join(CASES)}")
    if args.markdown:
        check_file(parser, "--markdown", args.markdown)
    femnist = [FEMNIST_WRITERS[c] for c in wanted if c in FEMNIST_WRITERS]
    if femnist and not args.budget_sweep:
        require_data(parser, [("femnist", args.femnist_dir, "--femnist-dir")], {"femnist": max(femnist)})
    if args.budget_sweep:
        lines = ["| model | PER_SAMPLE_BUDGET | glibc | vmap ms | loop ms | vmap faults | loop faults |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]
        for keep in (False, True):
            rows = _run({"repeats": args.repeats}, keep)
            for row in rows:
                if row["vectorize"]:
                    loop = next(r for r in rows if r["model"] == row["model"] and r["budget"] == row["budget"]
                                and not r["vectorize"])
                    lines.append(f"| {row['model']} | 2**{row['budget'].bit_length() - 1} | "
                                 f"{'keeps freed memory' if keep else 'default'} | {row['ms']:.0f} | "
                                 f"{loop['ms']:.0f} | {row['faults']:.0f} | {loop['faults']:.0f} |")
        print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; load "
              f"average {os.getloadavg()[0]:.1f}; one gradient call, P = 10, 400 samples each, float64, "
              f"min of {args.repeats}.\n")
        print("\n".join(lines))
        return 0

    started, load = time.monotonic(), os.getloadavg()[0]
    lines = ["| case | variant | s/round | peak RSS MiB | above start MiB | page faults/round | "
             "sys s/round |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for spec in cases(args):
        result = _run(spec, spec["keep"])
        per_round = result["seconds"] * spec["scale"]
        row = (f"| {spec['case']} | {spec['variant']} | {per_round:.2f} | {result['peak']:.0f} | "
               f"{result['peak'] - result['baseline']:.0f} | {result['faults']:.0f} | "
               f"{result['system']:.2f} |")
        lines.append(row)
        print(row, file=sys.stderr, flush=True)
    timing = "--quick" if args.quick else f"{args.rounds} timed rounds after a warm-up round"
    header = (f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; load "
              f"average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
              f"{time.monotonic() - started:.0f} s in all; {timing} (the FEMNIST MLP: 1 timed round; "
              "the CNN: 1 round, no warm-up).")
    table = "\n".join([header, "", *lines])
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
