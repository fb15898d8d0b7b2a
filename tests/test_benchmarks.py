"""The benchmark scripts on a fresh clone: each refuses a bad argument, and data it cannot find, in one line
and before any work; the ones whose data ship with dpadmm or scikit-learn run.

A fresh clone has no ../shared/data beside it and an empty data cache. Each script here runs as a user runs it
(``python -m benchmarks.<name>`` from the project root, a process of its own) with ``DPADMM_SHARED_DATA``
(``benchmarks.shared_data``: where a script looks for the development machine's data folder) pointed at a
folder that does not exist, and, for the scripts that look for data sets, ``DPADMM_CACHE`` at an empty
folder, so that they must stop and name the ``dpadmm data fetch`` that gets their data. The real runs keep
this process's cache (it holds the compiled C kernels; compiling them again takes 40 s of CPU per run) but
read only the embedded sample or scikit-learn's digits, which no cache holds; no download can happen either,
``DPADMM_DATA_MIRRORS`` points at a folder that does not exist.

Only the argument checks run under ``pytest -m "not slow"`` (a process that imports torch or flwr costs
seconds); the fresh-clone checks, the real runs and the Flower runs of ``flower_overhead`` and
``deployed_round`` (a minute each) are slow-marked. The first of those Flower runs is the regression test of
the FedAvg same-work variant, whose ClientApps once all failed (an import of a removed function) while the
script printed its table as a result.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import start_local_superlink
from benchmarks.flower_overhead import flwr_env
from benchmarks.noise_room import default_room
from dpadmm.iadmm.config import RunConfig
from tests.conftest import ROOT, _pids_with_env, stop_flwr_processes, words

PROG = "python -m benchmarks.{}"


def _env(tmp_path: Path, empty_cache: bool) -> dict[str, str]:
    """A fresh clone's environment: no shared data folder, no mirror; with ``empty_cache``, no data cache."""
    env = dict(os.environ, DPADMM_SHARED_DATA=str(tmp_path / "no-shared-data"),
               DPADMM_DATA_MIRRORS=(tmp_path / "no-mirror").as_uri())
    env.pop("PYTEST_CURRENT_TEST", None)  # benchmarks.suite_cpu would charge itself to this test
    if empty_cache:
        (tmp_path / "empty-cache").mkdir(exist_ok=True)
        env["DPADMM_CACHE"] = str(tmp_path / "empty-cache")
    return env


def _run(script: str, *args: str | Path, env: dict[str, str], timeout: float = 600
         ) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<script> <args>`` from the project root. The time allowed covers a first run's
    compiling of the C kernels into a new cache (a new user's; 40 s of CPU)."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{script}", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _refused(done: subprocess.CompletedProcess[str], script: str, *words: str) -> str:
    """The line of a refusal: exit status 2, nothing on stdout, one line on stderr that names ``words``."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "", done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{PROG.format(script)}: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# (script, arguments with {tmp} for this test's folder, what the line must name). Every output path given
# lies under {tmp}; the test checks that none of them was made.
BAD_ARGUMENTS = [
    ("builtin_dp", ["--out", "/dev/null/x"], ["--out /dev/null/x", "not a folder"]),
    ("central_optimum", ["--dataset", "default", "--max-iterations", "0", "--json", "{tmp}/o.json"],
     ["--max-iterations"]),
    ("compare_dp", ["--datasets", "main/logistic", "--eps", "0,1", "--out", "{tmp}/out"], ["--eps"]),
    ("compare_dp", ["--workers", "2", "--ray-address", "auto", "--out", "{tmp}/out"],
     ["--workers 2 with --ray-address 'auto'"]),
    ("compare_dp_terms", ["--seeds", "one", "--out", "{tmp}/out"], ["--seeds"]),
    ("deployed_round", ["--rounds", "1", "--keep", "{tmp}/keep", "--json", "{tmp}/d.json"], ["--rounds"]),
    ("engine_modules", ["--cases", "c,d", "--markdown", "{tmp}/t.md"], ["--cases"]),
    ("flower_overhead", ["--agents", "0", "--keep", "{tmp}/keep", "--json", "{tmp}/f.json"], ["--agents"]),
    ("grids", ["--modes", "seq,w0", "--work", "{tmp}/work", "--json", "{tmp}/g.json"], ["--modes", "w0"]),
    ("noise_room", ["--rooms", "-1,10", "--out", "{tmp}/out"], ["--rooms"]),
    ("numpy_reference", ["--rounds", "3"], ["--rounds"]),
    ("speed", ["--rounds", "0", "--markdown", "{tmp}/t.md"], ["--rounds"]),
    ("speed_linadmm", ["--runs", "0,1"], ["--runs"]),
    ("speed_sharing", ["--datasets", "gisette"], ["--datasets", "gisette"]),
    ("step_cost", ["--models", "mlp,cnn", "--json", "{tmp}/c.json"], ["model 'cnn'"]),
    ("step_rule", ["--models", "logistic", "--out", "/dev/null/x"], ["--out /dev/null/x"]),
    ("suite_cpu", ["--every", "0", "--json", "{tmp}/s.json"], ["--every"]),
]


@pytest.mark.parametrize(("script", "args", "words"), BAD_ARGUMENTS, ids=[c[0] for c in BAD_ARGUMENTS])
def test_a_bad_argument_is_one_line_before_anything_is_made(script: str, args: list[str], words: list[str],
                                                            tmp_path: Path) -> None:
    work = tmp_path / "work-folder"
    work.mkdir()
    _refused(_run(script, *[a.format(tmp=work) for a in args], env=_env(tmp_path, empty_cache=True)),
             script, *words)
    assert list(work.iterdir()) == []


def test_every_script_has_its_argument_check() -> None:
    scripts = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")
    assert sorted({c[0] for c in BAD_ARGUMENTS}) == scripts


def _chosen_runs(dataset: str) -> list[dict[str, object]]:
    """compare_dp's runs.jsonl records of a finished DP-IADMM tuning at eps 8 on ``dataset`` and the report
    run of the configuration it chose (seed 1): what compare_dp_terms retrains."""
    from benchmarks.compare_dp import GRIDS

    grid = GRIDS[dataset]["dpiadmm"]
    common = {"dataset": dataset, "method": "dpiadmm", "epsilon": 8.0}
    runs = [{**common, "key": f"tune-{i}", "phase": "tune", "seed": 0, "params": params,
             "val-error": 0.5 - i / 100} for i, params in enumerate(grid)]
    return [*runs, {**common, "key": "report", "phase": "report", "seed": 1, "params": grid[-1],
                    "val-error": 0.4, "test-error": 0.4}]


def _write_runs(folder: Path, runs: list[dict[str, object]]) -> None:
    folder.mkdir(parents=True)
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))


# (script, arguments, the data sets the line must name): on a fresh clone each stops before any work.
MISSING_DATA = [
    ("speed", [], ["mnist"]),
    # the baselines' methods left out: without Opacus (the compare extra) the script says so first
    ("compare_dp", ["--quick", "--methods", "dpiadmm,dpfedavg", "--out", "{tmp}/out"],
     ["mnist", "femnist", "a9a", "ijcnn1"]),
    ("compare_dp_terms", ["--seeds", "1", "--out", "{tmp}/terms"], ["a9a"]),
    ("central_optimum", [], ["femnist"]),
    ("engine_modules", ["--quick"], ["femnist"]),
    ("flower_overhead", ["--agents", "2", "--rounds", "2", "--keep", "{tmp}/keep"], ["femnist"]),
    ("grids", ["--modes", "seq", "--work", "{tmp}/work", "--", "--paper", "002"],
     ["a8a", "a9a", "bio_train", "ijcnn1"]),
    ("speed_linadmm", ["--datasets", "a9a,ijcnn1"], ["a9a", "ijcnn1"]),
    ("speed_sharing", [], ["a9a", "mnist"]),
]


@pytest.mark.slow  # nine processes that import torch or flwr: about 30 s of CPU
@pytest.mark.parametrize(("script", "args", "names"), MISSING_DATA,
                         ids=[f"{c[0]}{' '.join(c[1][:1])}" for c in MISSING_DATA])
def test_a_fresh_clone_is_told_which_data_to_fetch(script: str, args: list[str], names: list[str],
                                                  tmp_path: Path) -> None:
    """No ../shared/data and an empty cache: one line naming `dpadmm data fetch NAME` for each data set the
    run reads, and nothing made (no output folder, no process, no download)."""
    work = tmp_path / "work-folder"
    work.mkdir()
    if script == "compare_dp_terms":  # finished compare_dp runs on a9a, whose retraining reads a9a
        _write_runs(work / "terms", _chosen_runs("a9a"))
    env = _env(tmp_path, empty_cache=True)
    line = _refused(_run(script, *[a.format(tmp=work) for a in args], env=env), script)
    for name in names:
        assert f"`dpadmm data fetch {name}`" in line, line
    assert sorted(p.name for p in work.iterdir()) == (["terms"] if script == "compare_dp_terms" else [])
    assert list(Path(env["DPADMM_CACHE"]).iterdir()) == []


@pytest.mark.slow  # reads FEMNIST's writers
def test_a_folder_short_of_writers_is_refused_before_the_run(femnist_dir: Path, tmp_path: Path) -> None:
    """FEMNIST-195 on one LEAF sample (the cache's, 114 writers): one line that says so, not a traceback in
    the middle of the run."""
    sample = femnist_dir / "leaf-sample-a"
    line = _refused(_run("central_optimum", "--data-dir", sample, env=_env(tmp_path, empty_cache=False)),
                    "central_optimum", "--data-dir", "114 writers, 195 needed")
    assert "Traceback" not in line


# ----- the smallest real runs of the scripts whose data ship with dpadmm or scikit-learn -----

def _ran(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_builtin_dp_writes_its_table_from_its_runs(tmp_path: Path) -> None:
    """Every run already in runs.jsonl (the committed ones): no `flwr run`, the table written."""
    out = tmp_path / "builtin-dp"
    out.mkdir()
    shutil.copy(ROOT / "docs" / "results" / "builtin-dp" / "runs.jsonl", out)
    _ran(_run("builtin_dp", "--out", out, env=_env(tmp_path, empty_cache=False)))
    assert (out / "table.md").read_text().startswith("# DP-IADMM beside DP-SGD + FedAvg")


@pytest.mark.slow  # about 10 s
def test_step_cost_times_both_steps_of_each_model(tmp_path: Path) -> None:
    """The smallest run: one round of one step of each method per model, a row each, written as JSON."""
    out = tmp_path / "cost.json"
    printed = _ran(_run("step_cost", "--steps", "1", "--repeats", "1", "--json", out,
                        env=_env(tmp_path, empty_cache=False)))
    rows = json.loads(out.read_text())
    assert [(r["model"], r["per-sample"]) for r in rows] == [("small-cnn", "factorized"),
                                                              ("scatter-cnn", "factorized"),
                                                              ("mlp", "factorized")]
    assert all(r["ours-ms"] > 0 and r["opacus-ms"] > 0 for r in rows)
    assert "| small-cnn | 26,010 | factorized |" in printed


@pytest.mark.slow  # trains one run: about 15 s
def test_step_rule_trains_the_run_its_folder_lacks(tmp_path: Path) -> None:
    """The committed runs but one (logistic regression's rule, seed 2): that one is trained, the table
    written from all."""
    out = tmp_path / "step-rule"
    committed = ROOT / "docs" / "results" / "step-rule" / "runs.jsonl"
    runs = [json.loads(line) for line in committed.read_text().splitlines()]
    kept = [r for r in runs if (r["model"], r["row"], r["seed"]) != ("logistic", "rule", 2)]
    assert len(kept) == len(runs) - 1
    _write_runs(out, kept)
    printed = _ran(_run("step_rule", "--models", "logistic", "--out", out,
                        env=_env(tmp_path, empty_cache=False)))
    assert "logistic rule seed 2: test error" in printed
    assert len((out / "runs.jsonl").read_text().splitlines()) == len(runs)
    assert "| logistic |" in (out / "table.md").read_text()


@pytest.mark.slow  # trains one run: a few seconds
def test_noise_room_retrains_the_run_its_folder_lacks_to_the_committed_error(tmp_path: Path) -> None:
    """The committed runs but one (logistic regression, room 10, eps 8, the last seed): that one is trained
    alone, to the validation error committed for it (where it had been trained in a batch of seeds), and
    the table is written from all."""
    out = tmp_path / "noise-room"
    committed = ROOT / "docs" / "results" / "noise-room" / "runs.jsonl"
    runs = [json.loads(line) for line in committed.read_text().splitlines()]
    cell = [r for r in runs if (r["setting"], r["room"], r["epsilon"]) == ("main/logistic", 10.0, 8.0)]
    last = max(cell, key=lambda r: r["seed"])
    _write_runs(out, [r for r in runs if r is not last])
    printed = _ran(_run("noise_room", "--settings", "main/logistic", "--rooms", "10", "--eps", "8",
                        "--seeds", str(last["seed"]), "--out", out, env=_env(tmp_path, empty_cache=False)))
    assert "main/logistic room 10 eps 8: validation error" in printed
    retrained = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    assert retrained["seed"] == last["seed"] and retrained["val-error"] == last["val-error"]
    assert "| main/logistic | 10 (default) |" in (out / "table.md").read_text()


def test_the_pages_logistic_room_on_femnist_is_what_the_committed_runs_give() -> None:
    """docs/families/iadmm.md's paragraph on logistic regression's room sqrt(P K), recomputed from
    docs/results/noise-room/runs.jsonl: FEMNIST's default room, every smaller room worse at every eps (the
    main job's room scaled by sqrt(P / 10) alone by the range given), the largest within the points and
    standard errors given; the default is what the rule takes there."""
    page = words((ROOT / "docs" / "families" / "iadmm.md").read_text())
    log = ROOT / "docs/results/noise-room/runs.jsonl"
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    femnist = [r for r in runs if r["setting"] == "femnist/logistic"]
    default = default_room("femnist/logistic")
    assert default == math.sqrt(195 * 62) and f"give a room of {default:.0f}" in page

    def paired(room: float, eps: float) -> tuple[float, float]:
        here, base = ({r["seed"]: 100 * r["val-error"] for r in femnist
                       if r["room"] == x and r["epsilon"] == eps} for x in (room, default))
        assert sorted(here) == sorted(base) == [10, 11, 12, 13]
        d = [here[s] - base[s] for s in here]
        return statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))

    rooms = sorted({r["room"] for r in femnist} - {default})
    eps = sorted({r["epsilon"] for r in femnist})
    assert f"--rooms 0,{','.join(f'{room:.4g}' for room in rooms)}" in page
    assert f"about {sum(r['seconds'] for r in femnist) / 60:.0f} minutes of one core" in page
    smaller, largest = [room for room in rooms if room < default], max(rooms)
    assert all(paired(room, e)[0] > 0 for room in smaller for e in eps)  # "every smaller room did worse"
    scaled = min(smaller, key=lambda room: abs(room - 10 * math.sqrt(195 / 10)))  # as the command gives it
    assert scaled == pytest.approx(10 * math.sqrt(195 / 10), abs=0.005)
    gaps = [paired(scaled, e)[0] for e in eps]
    assert f"({scaled:.2f}) by {min(gaps):.2f} to {max(gaps):.2f} points" in page
    near = [paired(largest, e) for e in eps]
    points = max(abs(mean) for mean, _ in near)
    errors = max(abs(mean) / se for mean, se in near if se > 0)
    assert f"{largest:.4g} ended within {points:.2f} points of {default:.0f} at every eps" in page
    assert f"at most {errors:.1f} standard errors" in page
    assert (f"{largest:.0f} within {points:.2f} points at every eps (at most {errors:.1f} standard errors"
            in words(RunConfig.noise_room_for.__doc__ or ""))


@pytest.mark.slow  # about 7 s
def test_central_optimum_on_the_embedded_sample(tmp_path: Path) -> None:
    result = tmp_path / "optimum.json"
    _ran(_run("central_optimum", "--dataset", "default", "--max-iterations", "10", "--json", result,
              env=_env(tmp_path, empty_cache=False)))
    numbers = json.loads(result.read_text())
    assert numbers["dataset"] == "default" and numbers["iterations"] == 10
    assert 0 < numbers["test-error"] < 0.5


@pytest.mark.slow  # a local Ray instance: about a minute on 2 idle cores
def test_compare_dp_on_ray_gives_the_runs_it_gives_here(tmp_path: Path) -> None:
    """``--workers 2``: the runs are the grid runner's cells on Ray, committed to runs.jsonl as they finish,
    with the errors the same runs give one after another in one process (DP-IADMM's and DP-SGD's)."""
    found = {}
    for label, extra in (("here", []), ("ray", ["--workers", "2"])):
        out = tmp_path / label
        _ran(_run("compare_dp", "--quick", "--datasets", "main/logistic", "--methods", "dpiadmm,dpsgd",
                  "--out", out, *extra, env=_env(tmp_path, empty_cache=False)))
        runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
        found[label] = {r["key"]: (r["val-error"], r["test-error"]) for r in runs}
    assert len(found["here"]) == 6  # per method: one tuning run, one reported seed, one without noise
    assert found["ray"] == found["here"]


@pytest.mark.slow  # about 9 s
def test_compare_dp_quick_on_the_embedded_sample(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    printed = _ran(_run("compare_dp", "--quick", "--datasets", "main/logistic", "--methods", "dpiadmm",
                        "--out", out, env=_env(tmp_path, empty_cache=False)))
    assert "wrote" in printed
    phases = sorted(json.loads(line)["phase"] for line in (out / "runs.jsonl").read_text().splitlines())
    assert phases == ["reference", "report", "tune"]
    assert (out / "table.md").exists() and (out / "models.png").exists()


@pytest.mark.slow  # about 9 s
def test_compare_dp_terms_retrains_the_chosen_configuration(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    _write_runs(out, _chosen_runs("main/logistic"))
    printed = _ran(_run("compare_dp_terms", "--seeds", "1", "--out", out,
                        env=_env(tmp_path, empty_cache=False)))
    assert "| main/logistic | 8 |" in printed
    assert "| main/logistic | 8 |" in (out / "terms.md").read_text()


def test_numpy_reference_says_what_it_is(tmp_path: Path) -> None:
    done = _run("numpy_reference", env=_env(tmp_path, empty_cache=True))
    assert done.returncode == 0 and done.stdout == ""
    assert "benchmarks.speed" in done.stderr


# ----- flower_overhead: a variant whose replies were lost is a failure, not a table -----

def test_flower_overhead_prints_no_table_when_replies_were_lost(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A variant with rounds of zero accepted replies (every ClientApp failed) makes the script fail: exit
    status 1, one line that names the variant and its rounds, no table. The Flower run is replaced by its
    result, so that this runs in a second; the slow test below runs Flower."""
    from benchmarks import flower_overhead

    def lost_replies(variant: str, args: object, work: Path) -> flower_overhead.RunResult:
        records = [{"round": 1, "replied": 0, "seconds": 1.0}, {"round": 2, "replied": 0, "seconds": 0.1}]
        return flower_overhead.RunResult(variant, "flwr run ...", seconds=[1.0, 0.1], cycle=[1.0, 0.1],
                                         returncode=0, error=flower_overhead.incomplete_rounds(records, 2))

    info = {"platform": "test", "cpu_count": 2, "cpus_usable": 2, "loadavg": (0.0, 0.0, 0.0), "python": "3",
            "flwr": "x", "ray": "x", "torch": "x"}
    monkeypatch.setattr(flower_overhead, "run_variant", lost_replies)
    monkeypatch.setattr(flower_overhead, "machine", lambda: info)
    monkeypatch.setattr(flower_overhead.signal, "signal", lambda *args: None)  # this worker's SIGTERM stays
    with pytest.raises(SystemExit) as stopped:
        flower_overhead.main(["--agents", "2", "--rounds", "2", "--variants", "fedavg-echo"])
    assert stopped.value.code == 1
    out, err = capsys.readouterr()
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("python -m benchmarks.flower_overhead: error: ") and "no table" in last, err
    assert "fedavg-echo: rounds with fewer than 2 accepted replies (round: replies): {1: 0, 2: 0}" in last


def test_the_fedavg_same_work_client_builds_its_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same-work ClientApp's own code path up to the local round: its imports and the calibrated run
    config (an import of a removed function failed every ClientApp of the variant)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "fedavg_app"))
    from fedavg_bench import client_app

    config = client_app._run_config({"algorithm": "objpm", "preset": "main", "target-epsilon": 8.0,
                                     "epsilon": 0.0, "num-agents": 2, "rounds": 2, "bench-mode": "same-work"})
    assert config.epsilon > 0 and config.num_agents == 2  # eps-bar calibrated to the whole run's 8


def test_the_fedavg_same_work_client_runs_the_configuration_of_ours(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """Same work: from the run configs the benchmark gives the two apps (each merged over its pyproject's,
    as Flower merges them), the same-work ClientApp builds the configuration the main ClientApp computes
    with, but for where the main app writes and evaluates. Its keys once took RunConfig's defaults where the
    main app read the papers' preset: a fifth of the data per step and one array replied, so `ours` looked
    1.2 times slower than the same work."""
    import dataclasses

    from flwr.common.config import flatten_dict, get_project_config, parse_config_args

    from benchmarks import flower_overhead
    from dpadmm.families import from_run_config
    from dpadmm.iadmm import privacy

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "fedavg_app"))
    from fedavg_bench import client_app

    args = flower_overhead.build_parser().parse_args(["--femnist-dir", str(tmp_path)])
    built = {}
    for variant in ("ours", "fedavg-same-work"):
        command, _, _ = flower_overhead.variant_command(variant, args, tmp_path / variant)
        app = Path(command[2])
        merged = {**flatten_dict(get_project_config(app)["tool"]["flwr"]["app"]["config"]),
                  **parse_config_args([command[command.index("--run-config") + 1]])}
        built[variant] = (privacy.calibrate(from_run_config(merged)) if variant == "ours"
                          else client_app._run_config(merged))
    ours, same = built["ours"], built["fedavg-same-work"]
    assert ours.algorithm == "objpm" and ours.sampling_rate == 1 and ours.sends_last_iterate
    assert dataclasses.replace(same, out=ours.out, eval_every=ours.eval_every) == ours


@pytest.mark.slow  # a Flower simulation of 2 SuperNodes: about a minute
def test_flower_overhead_fedavg_same_work_replies_are_accepted(femnist_dir: Path, tmp_path: Path) -> None:
    keep, result = tmp_path / "keep", tmp_path / "overhead.json"
    try:
        printed = _ran(_run("flower_overhead", "--agents", "2", "--rounds", "2", "--variants",
                            "fedavg-same-work", "--femnist-dir", femnist_dir, "--keep", keep, "--json",
                            result, env=_env(tmp_path, empty_cache=False), timeout=300))
    finally:
        for home in keep.glob("*/*/flwr-home"):
            stop_flwr_processes(home)
    (run,) = json.loads(result.read_text())["runs"]
    assert run["variant"] == "fedavg-same-work" and run["error"] == ""
    assert [r["replied"] for r in run["records"]] == [2, 2]
    assert "| FEDAVG-SAME-WORK | 2 |" in printed


@pytest.mark.slow  # a loopback deployment of one SuperNode: about a minute
def test_deployed_round_runs_the_main_job_on_one_node(tmp_path: Path) -> None:
    result = tmp_path / "deployed.json"
    _ran(_run("deployed_round", "--nodes", "1", "--rounds", "2", "--load", "0", "--variants", "ours",
              "--json", result, env=_env(tmp_path, empty_cache=False), timeout=400))
    (run,) = json.loads(result.read_text())["runs"]
    assert run["error"] == "" and len(run["cycle"]) == 2


@pytest.mark.slow  # three engine processes, about 30 s
def test_engine_modules_case_c_on_the_embedded_sample(tmp_path: Path) -> None:
    table = tmp_path / "modules.md"
    _ran(_run("engine_modules", "--quick", "--cases", "c", "--markdown", table,
              env=_env(tmp_path, empty_cache=False), timeout=300))
    rows = [line for line in table.read_text().splitlines() if line.startswith("| (c)")]
    assert [row.split(" | ")[1] for row in rows] == ["closed form", "vmap", "loop"]


def _superlinks(home: str) -> list[int]:
    """The SuperLink processes run with FLWR_HOME=home."""
    return [pid for pid in _pids_with_env("FLWR_HOME", home)
            if b"flower-superlink" in Path(f"/proc/{pid}/cmdline").read_bytes()]


@pytest.mark.slow  # a SuperLink process: seconds of imports
def test_the_local_superlink_started_first_is_the_one_flwr_uses(tmp_path: Path) -> None:
    """``start_local_superlink`` returns once the SuperLink answers on the run's port; ``flwr ls`` (which,
    like ``flwr run``, starts a SuperLink of its own only when none answers) then uses that one, and
    stopping the run's processes by its FLWR_HOME stops it."""
    env = flwr_env(tmp_path / "flwr-home")
    try:
        start_local_superlink(env)
        started = _superlinks(env["FLWR_HOME"])
        listed = subprocess.run([str(Path(sys.executable).parent / "flwr"), "ls", "--format", "json"],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        output = listed.stdout + listed.stderr
        assert listed.returncode == 0 and json.loads(listed.stdout)["runs"] == [], output
        assert "Starting local SuperLink" not in output and len(started) == 1
        assert _superlinks(env["FLWR_HOME"]) == started
    finally:
        assert stop_flwr_processes(Path(env["FLWR_HOME"])) == []


def test_a_local_superlink_that_does_not_answer_in_time_is_stopped_and_named(tmp_path: Path) -> None:
    env = flwr_env(tmp_path / "flwr-home")
    with pytest.raises(RuntimeError, match=r"did not answer within 0\.01 s; its log .*superlink\.log"):
        start_local_superlink(env, timeout=0.01)
    assert stop_flwr_processes(Path(env["FLWR_HOME"])) == []
