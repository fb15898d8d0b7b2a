"""DP-IADMM beside DP-SGD + FedAvg and Flower's DP-FedAvg on one task: accuracy, time, code, epsilon.

The task is ``examples/digits_app``: a 2-layer MLP on scikit-learn's 8 x 8 digits over 5 clients, 10
rounds, the whole run at (8, 1e-5). Each run is a real ``flwr run`` of the app on Flower's simulation
engine (5 SuperNodes), with ``method``:

- ``dpiadmm``: dpadmm's ``strategies.DPIADMM`` and ``clients.dpiadmm.train_reply``, with RunConfig's
  defaults (no tuning), seeds 0 to 9;
- ``dp-sgd``: the like-for-like baseline, at the same promise: Flower's plain ``FedAvg`` over clients that
  train with Opacus's DP-SGD (the recipe of Flower's Opacus example), with DP-IADMM's local steps, Poisson
  rate, clipping norm and budget, its noise multiplier calibrated by Opacus's PRV accountant. Its one free
  setting, the clients' learning rate, is searched on seed 0 over :data:`DPSGD_GRID`, scored on the final
  test accuracy itself (which favours it, as for DP-FedAvg), and the best is run on seeds 1 to 9;
- ``dp-fedavg``: another promise (client-level, central, with a trusted server): Flower's ``FedAvg`` inside
  ``DifferentialPrivacyClientSideFixedClipping`` with ``fixedclipping_mod`` on the clients, its noise
  multiplier set so that Flower's ``RdpAccountant`` reports the target. Its free settings (the clipping
  norm, the local step size) are searched on seed 0 over :data:`GRID`, scored on the test accuracy itself
  (which favours it), and the best is run on seeds 1 to 9.

The lines of code are those of ``digits_app/dpiadmm.py``, ``digits_app/dpsgd.py`` and
``digits_app/dpfedavg.py``, the code each method needs beyond the shared task (``task.py``), counted without
blank lines, comments and docstrings.
Every run is appended to ``runs.jsonl`` in ``--out`` and skipped by a later call; ``table.md`` is
written from all of them.

Usage, from the project root::

    python -m benchmarks.builtin_dp [--out docs/results/builtin-dp]

Its data (scikit-learn's digits) ship with scikit-learn, so it needs no data folder; the DP-SGD runs need
Opacus (``pip install -e ".[compare]"``). A benchmark script, not a test.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import re
import statistics
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path
from typing import Any

from benchmarks import ArgumentParser, check_folder, start_local_superlink
from benchmarks.flower_overhead import flwr_env, machine
from dpadmm.runs import references as bibliography
from tests.conftest import stop_flwr_processes, toml_value  # the clean-up of the Flower tests

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "digits_app"
# Ten: with three, the like-for-like rows' order moved with the seeds (on 360 test images one image is 0.3
# points, and DP-IADMM's and DP-SGD's seeds spread by about 0.01).
SEEDS = tuple(range(10))
# DP-FedAvg's free settings searched on seed 0: the clipping norm C of a client's update and the local
# step size (5 local epochs of minibatches of 32 throughout).
GRID = tuple({"fedavg-clip": clip, "fedavg-lr": lr}
             for clip in (0.1, 0.3, 1.0, 3.0) for lr in (0.03, 0.1, 0.3))
# DP-SGD's one free setting searched on seed 0: the clients' learning rate (on the mean loss of a Poisson
# batch; the clipping norm, rate and steps are DP-IADMM's, so that both are held to the same figures).
DPSGD_GRID = tuple({"dpsgd-lr": lr} for lr in (0.25, 0.5, 1.0, 2.0, 4.0))
REFERENCES = ("003", "abadi2016", "yousefpour2021", "mcmahan2017", "mcmahan2018")
# The accountant each method's epsilon is reported by.
ACCOUNTANTS = {"dpiadmm": "PLD", "dp-sgd": "PRV", "dp-fedavg": "RDP"}


def code_lines(path: Path) -> int:
    """Lines of ``path`` holding code: no blank lines, comments or docstrings."""
    source = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    lines = {token.start[0] for token in tokenize.tokenize(io.BytesIO(source.encode()).readline)
             if token.type not in skip}
    return len(lines - docstrings)


def run(keys: dict[str, Any], log: Path) -> dict[str, Any]:
    """One ``flwr run`` of the app with ``keys`` over the pyproject's; its results file."""
    with tempfile.TemporaryDirectory(prefix="builtin-dp-") as work:
        home, out = Path(work, "home"), Path(work, "results.json")
        config = " ".join(f"{k}={toml_value(v)}" for k, v in {**keys, "out": str(out)}.items())
        flwr = Path(sys.executable).parent / "flwr"
        command = [str(flwr) if flwr.exists() else "flwr", "run", str(APP), "--stream",
                   "--run-config", config, "--federation-config", "num-supernodes=5"]
        env = flwr_env(home)
        try:
            start_local_superlink(env)
            with log.open("a") as fh:
                done = subprocess.run(command, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                      timeout=1800)
        finally:
            stop_flwr_processes(home)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"flwr run exited with {done.returncode} for {config}; see {log}")
        result = json.loads(out.read_text())
        if "epsilon" not in result:
            raise RuntimeError(f"the run of {config} ended before its statement; see {log}")
        return result


def final(record: dict[str, Any]) -> float:
    return record["rounds"][-1]["accuracy"]


def best(runs: list[dict[str, Any]], method: str, grid: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """The keys of ``method``'s grid point with the best final accuracy on seed 0, once the whole grid ran."""
    searched = [r for r in runs if r["method"] == method and r["seed"] == 0]
    return max(searched, key=final)["keys"] if len(searched) == len(grid) else None


def best_fedavg(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The grid point of DP-FedAvg with the best final accuracy on seed 0."""
    return best(runs, "dp-fedavg", GRID)


def best_dpsgd(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The learning rate of DP-SGD with the best final accuracy on seed 0."""
    return best(runs, "dp-sgd", DPSGD_GRID)


def seconds_per_round(record: dict[str, Any]) -> float:
    """Median wall-clock seconds of rounds 2..T, evaluation included (round 1 carries the clients' start-up;
    the median keeps a round slowed by other work on the machine from moving the figure)."""
    elapsed = [r["elapsed"] for r in record["rounds"] if r["round"] >= 1]
    return statistics.median(b - a for a, b in zip(elapsed[:-1], elapsed[1:], strict=True))


def table(runs: list[dict[str, Any]]) -> str:
    """The results table (the like-for-like pair first, then the other promise), what each epsilon covers,
    and the two searches."""
    fedavg, dpsgd = best_fedavg(runs), best_dpsgd(runs)
    rows = {"dpiadmm": [r for r in runs if r["method"] == "dpiadmm"],
            "dp-sgd": [r for r in runs if r["method"] == "dp-sgd" and r["keys"] == dpsgd],
            "dp-fedavg": [r for r in runs if r["method"] == "dp-fedavg" and r["keys"] == fedavg]}
    lines = {"dpiadmm": code_lines(APP / "digits_app" / "dpiadmm.py"),
             "dp-sgd": code_lines(APP / "digits_app" / "dpsgd.py"),
             "dp-fedavg": code_lines(APP / "digits_app" / "dpfedavg.py")}
    searched = (f"C = {fedavg['fedavg-clip']:g}, step {fedavg['fedavg-lr']:g}" if fedavg
                else "search unfinished")
    lr = f"learning rate {dpsgd['dpsgd-lr']:g}" if dpsgd else "search unfinished"
    names = {"dpiadmm": "DP-IADMM (`strategies.DPIADMM`, RunConfig's defaults)",
             "dp-sgd": f"DP-SGD + FedAvg (Opacus's `make_private` on the clients, Flower's `FedAvg`; {lr})",
             "dp-fedavg": f"another promise: Flower's FedAvg + `DifferentialPrivacyClientSideFixedClipping` "
                          f"(client-level, central, trusted server; {searched})"}
    out = ["| method | lines of code | test accuracy after round 1 / 3 / 10 (seed 0) | after 10 rounds, "
           f"seeds 0-{SEEDS[-1]} | s per round | eps (delta = 1e-5), whole run |",
           "| --- | ---: | --- | --- | ---: | --- |"]
    for method, records in rows.items():
        if not records:
            continue
        seed0 = next((r for r in records if r["seed"] == 0), records[0])
        by_round = {r["round"]: r["accuracy"] for r in seed0["rounds"]}
        finals = [final(r) for r in records]
        spread = f" +- {statistics.stdev(finals):.3f}" if len(finals) > 1 else ""
        out.append(f"| {names[method]} | {lines[method]} | {by_round[1]:.3f} / {by_round[3]:.3f} / "
                   f"{by_round[10]:.3f} | {statistics.mean(finals):.3f}{spread} ({len(finals)} seeds) | "
                   f"{statistics.mean(seconds_per_round(r) for r in records):.2f} | "
                   f"{statistics.mean(r['epsilon'] for r in records):.3f} ({seed0['accountant']}) |")
    out += ["", "The first two rows make the same promise (sample-level and local: each client adds the "
            "noise before anything leaves it) and compare like for like; the third makes another "
            "(client-level and central: the server adds the noise and must be trusted), so its accuracy "
            "answers another question.", "", *meaning(rows)]
    lrs = sorted((r for r in runs if r["method"] == "dp-sgd" and r["seed"] == 0),
                 key=lambda r: r["keys"]["dpsgd-lr"])
    if lrs:
        out += ["", "DP-SGD's search (seed 0, test accuracy after 10 rounds):", "",
                "| learning rate | " + " | ".join(f"{r['keys']['dpsgd-lr']:g}" for r in lrs) + " |",
                "| --- | " + " | ".join("---:" for _ in lrs) + " |",
                "| accuracy | " + " | ".join(f"{final(r):.3f}" for r in lrs) + " |"]
    grid = sorted((r for r in runs if r["method"] == "dp-fedavg" and r["seed"] == 0),
                  key=lambda r: (r["keys"]["fedavg-clip"], r["keys"]["fedavg-lr"]))
    if grid:
        out += ["", "DP-FedAvg's search (seed 0, test accuracy after 10 rounds):", "",
                "| C | step 0.03 | step 0.1 | step 0.3 |", "| ---: | ---: | ---: | ---: |"]
        for clip in sorted({r["keys"]["fedavg-clip"] for r in grid}):
            cells = [f"{final(r):.3f}" for r in grid if r["keys"]["fedavg-clip"] == clip]
            out.append(f"| {clip:g} | {' | '.join(cells)} |")
    return "\n".join(out) + "\n"


def meaning(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What each method's epsilon covers, with the noise each run added (from the runs' records)."""
    # the strategy's mechanism line with its numbers to 4 digits ("gaussian, noise multiplier 1.444, ...")
    iadmm = re.sub(r"\d+\.\d{5,}", lambda m: f"{float(m.group()):.4g}", rows["dpiadmm"][0]["mechanism"])
    fedavg = rows["dp-fedavg"][0] if rows["dp-fedavg"] else None
    z = f"z = {fedavg['noise_multiplier']:.4g}" if fedavg else "z"
    sgd = rows["dp-sgd"][0]["mechanism"] if rows["dp-sgd"] else "noise multiplier z"
    return [
        "What each epsilon covers:", "",
        "| | DP-IADMM | DP-SGD + FedAvg (Opacus) | Flower's DP-FedAvg (client-side fixed clipping) |",
        "| --- | --- | --- | --- |",
        "| neighbouring data sets | one training sample of one client added or removed (sample-level) | "
        "the same (sample-level) | one client's whole data set added or removed (client-level) |",
        f"| noise, added by | each client, at each local step, before anything leaves it ({iadmm}) | each "
        f"client, at each local step, before anything leaves it ({sgd}: standard deviation z C on the sum "
        f"of the clipped gradients) | the server, once a round, to the average of the clipped updates ({z}: "
        "standard deviation z C / n) |",
        "| holds against | everyone who sees what a client sends, the server included | the same: everyone "
        "who sees what a client sends, the server included | those who see the global models; the server "
        "receives each client's clipped update without noise and must be trusted |",
        "| accountant | dp-accounting's PLD, Poisson subsampling credited | Opacus's PRV, Poisson "
        "subsampling credited | Flower's `RdpAccountant` (dp-accounting's RDP), no amplification |",
    ]


def jobs(runs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """(keys, seed) of the runs still to do, the search before its best's other seeds."""
    todo: list[tuple[dict[str, Any], int]] = [({"method": "dpiadmm"}, seed) for seed in SEEDS]
    todo += [({"method": "dp-fedavg", **point}, 0) for point in GRID]
    todo += [({"method": "dp-sgd", **point}, 0) for point in DPSGD_GRID]
    for chosen in (best_fedavg(runs), best_dpsgd(runs)):
        if chosen is not None:
            todo += [(chosen, seed) for seed in SEEDS[1:]]
    done = [(r["keys"], r["seed"]) for r in runs]
    return [job for job in todo if job not in done]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.builtin_dp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/builtin-dp")
    args = parser.parse_args(argv)
    out = Path(args.out)
    check_folder(parser, "--out", out)
    path, log = out / "runs.jsonl", ROOT / "runs" / "builtin-dp.log"  # runs/ is not tracked
    try:
        runs = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    except (OSError, ValueError) as error:
        parser.error(f"--out {out}: {path} is not this script's runs.jsonl ({error})")
    needs_opacus = any(keys["method"] == "dp-sgd" for keys, _ in jobs(runs))
    if needs_opacus and importlib.util.find_spec("opacus") is None:
        parser.error("the DP-SGD runs need Opacus, which is not installed: pip install -e \".[compare]\"")
    out.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    while todo := jobs(runs):
        keys, seed = todo[0]
        result = run({**keys, "seed": seed}, log)
        record = {"keys": keys, "seed": seed, "method": keys["method"], "rounds": result["rounds"],
                  "epsilon": result["epsilon"], "delta": result["delta"],
                  "accountant": ACCOUNTANTS[keys["method"]],
                  "statement": result["line"], "mechanism": result.get("mechanism"),
                  "noise_multiplier": result.get("noise_multiplier"), "machine": machine()}
        print(f"{json.dumps(keys)} seed {seed}: accuracy {final(record):.3f}, "
              f"{seconds_per_round(record):.2f} s per round", flush=True)
        with path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        runs.append(record)
    facts = runs[0]["machine"]
    loads = sorted(r["machine"]["loadavg"][0] for r in runs)  # the s per round depend on it
    (out / "table.md").write_text(
        "# DP-IADMM beside DP-SGD + FedAvg and Flower's built-in DP\n\n"
        "Generated by `python -m benchmarks.builtin_dp`: "
        "`examples/digits_app` (a 64-32-10 MLP on scikit-learn's digits, 5 clients of 287 or 288 images, "
        "10 rounds, the whole run at delta = 1e-5) through `flwr run` on Flower's simulation engine "
        f"(flwr {facts['flwr']}, torch {facts['torch']}, {facts['cpus_usable']} cores, {facts['machine']}, "
        f"load {loads[0]:.1f} to {loads[-1]:.1f} at the runs' starts).\n\n" + table(runs) + "\n"
        + "\n".join(bibliography.section(REFERENCES)) + "\n")
    print(f"wrote {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
