"""`dpadmm train | privacy | reproduce | audit`: the console script, its output files and its errors, per
family (its own process in one test, its ``main`` in this process in the others)."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.corrupt import truncated

Run = Callable[..., subprocess.CompletedProcess]


def _script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The installed console script in a process of its own."""
    script = Path(sys.executable).with_name("dpadmm")
    return subprocess.run([str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def dpadmm(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``dpadmm ARGS`` run from ``cwd`` by the console script's ``main`` in this process: its exit status
    (argparse's exits included) and what it printed, as :func:`_script` returns them. A process of its own
    costs each command 2-3 s of CPU to import torch, Flower and dp-accounting again; what only the script's
    own process does (its progress bar on a pipe, the malloc settings of ``dpadmm train``) is checked
    through :func:`_script` in test_train_writes_metrics_and_reports and tests/test_memory.py."""
    from dpadmm.cli import main

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            status = main(list(args))
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        printed = capsys.readouterr()
        return subprocess.CompletedProcess(["dpadmm", *args], status, printed.out, printed.err)

    return run


def test_train_writes_metrics_and_reports(tmp_path: Path) -> None:
    done = _script("train", "--preset", "papers", "--algorithm", "objpm", "--epsilon", "1", "--rounds", "3",
                   "--local-steps", "2", "--num-agents", "5", "--eval-every", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "runs" / "objpm-epsbar1-E2-seed0"  # eps-bar given: named per step
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [1, 2, 3]
    assert "round 3 test error" in done.stdout and str(out / "metrics.jsonl") in done.stdout
    assert "round" in done.stderr  # the progress bar


@pytest.mark.slow
def test_a_signalled_train_marks_what_it_spent_and_the_same_command_resumes(tmp_path: Path) -> None:
    """SIGTERM is Ctrl-C for `dpadmm train`: one line and no traceback, exit 130, failed.json with the rounds
    completed, privacy.json with what those rounds spent (not the planned run's), and the same command
    resumes from the checkpoint and ends with the metrics an uninterrupted run writes."""
    args = ["train", "--rounds", "60", "--eval-every", "1", "--checkpoint-minutes", "0.001", "--no-progress",
            "--out", "run"]
    script = Path(sys.executable).with_name("dpadmm")
    proc = subprocess.Popen([str(script), *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 600  # a first train may build the native kernel first
    while time.monotonic() < deadline and proc.poll() is None and (
            not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.05)
    assert proc.poll() is None and len(metrics.read_text().splitlines()) >= 3, "no third round to interrupt"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    failed = json.loads((tmp_path / "run" / "failed.json").read_text())
    done = failed["completed-rounds"]
    assert 3 <= done < 60 and failed["error"] == "KeyboardInterrupt"
    spent = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert spent["stopped-after-round"] == done and spent["whole_run"]["releases"] == 10 * done
    assert spent["whole_run"]["epsilon_pld"] < 8.0  # the planned run's whole budget is 8
    assert f"interrupted after {done} completed round(s)" in err and "resume from round" in err

    again = _script(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming the interrupted run" in again.stderr
    run = tmp_path / "run"
    assert not (run / "failed.json").exists() and not (run / "checkpoint.pt").exists()
    whole = _script(*[a if a != "run" else "whole" for a in args], cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    resumed = [json.loads(x) for x in metrics.read_text().splitlines()]
    straight = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in resumed] == list(range(1, 61))
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == \
        [{k: v for k, v in r.items() if k not in drop} for r in straight]
    planned = json.loads((run / "privacy.json").read_text())["whole_run"]  # the complete run's again
    assert planned["epsilon_pld"] == pytest.approx(8.0, rel=0.01) and planned["releases"] == 600


@pytest.mark.slow
def test_a_signalled_train_of_another_family_ends_in_one_line_and_marks_its_folder(tmp_path: Path,
                                                                                  binary_dir: Path) -> None:
    """DP-ADMM's engine keeps no checkpoint: SIGTERM still ends `dpadmm train` in one line (exit 130, no
    traceback), its folder marked failed with the rounds completed and its privacy.json with what they spent
    (the noise of Theorem 1 for the planned T, composed over the rounds done), and the line says a rerun
    starts over."""
    script = Path(sys.executable).with_name("dpadmm")
    proc = subprocess.Popen([str(script), "train", "--algorithm", "dp-admm", "--dataset", "a9a", "--data-dir",
                             str(binary_dir / "a9a"), "--rounds", "3000", "--no-progress", "--out", "run"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (
            metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    failed = json.loads((tmp_path / "run" / "failed.json").read_text())
    assert failed["completed-rounds"] >= 2 and failed["error"] == "KeyboardInterrupt"
    line = err.strip().splitlines()[-1]
    done = failed["completed-rounds"]
    assert line.startswith(f"dpadmm: interrupted after {done} completed round(s); run")
    assert "its privacy.json states what those rounds spent" in line
    assert "keeps no checkpoint: the same command starts a new run from round 1" in line
    spent = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert spent["stopped-after-round"] == done and spent["whole_run"]["releases"] == done  # one per round


def test_train_meeting_a_damaged_checkpoint_says_so_in_one_line(tmp_path: Path, dpadmm: Run) -> None:
    """An interrupted run's folder (failed.json and checkpoint.pt) whose checkpoint was damaged: the same
    command stops with one error line naming it (dpadmm.runs.checkpoint.read), and nothing of the folder
    is overwritten."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "failed.json").write_text(json.dumps({"completed-rounds": 1}))
    (folder / "checkpoint.pt").write_bytes(b"damaged")
    done = dpadmm("train", "--rounds", "2", "--out", str(folder), cwd=tmp_path)
    said = done.stderr.strip().splitlines()  # the resume it tried, then why it stopped
    assert done.returncode == 2 and len(said) == 2, done.stderr
    assert said[0] == f"dpadmm: resuming the interrupted run in {folder} from its checkpoint"
    assert said[1].startswith(f"dpadmm: error: checkpoint {folder / 'checkpoint.pt'} cannot be read as a "
                              "dpadmm checkpoint") and said[1].endswith("delete it to start this run afresh "
                                                                         "from round 1")
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.pt", "failed.json"]


def test_one_round_reports_the_model_it_trained(tmp_path: Path, dpadmm: Run) -> None:
    """Flower's convention: round t's metrics evaluate the model after round t's releases, so one round (which
    spends the whole budget) reports a trained model, not the zero model it started from (error 0.9, loss
    ln 10)."""
    done = dpadmm("train", "--rounds", "1", "--out", "r", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert record["round"] == 1
    assert record["test-error"] < 0.5 and record["train-loss"] < 0.8 * math.log(10)


def test_epsilon_inf_means_non_private(tmp_path: Path, dpadmm: Run) -> None:
    done = dpadmm("train", "--preset", "papers", "--algorithm", "objp", "--epsilon", "inf", "--rounds", "2",
                  "--out", "r", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["noise-magnitude"] == 0 for r in lines)


def test_train_deals_the_agents_a_heterogeneous_partition(tmp_path: Path, dpadmm: Run) -> None:
    done = dpadmm("train", "--rounds", "2", "--num-agents", "10", "--partition", "shards:1",
                  "--partition-seed", "4", "--out", "r", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["partition"] == "shards:1" and config["partition-seed"] == 4
    bad = dpadmm("train", "--partition", "dirichlet", cwd=tmp_path)
    assert bad.returncode == 2 and "partition='dirichlet' is not allowed; give contiguous" in bad.stderr


def test_bad_input_is_named(tmp_path: Path, dpadmm: Run) -> None:
    done = dpadmm("train", "--algorithm", "sgd", cwd=tmp_path)
    assert done.returncode == 2 and "algorithm='sgd' is not allowed" in done.stderr
    done = dpadmm("train", "--dataset", "mnist", "--data-dir", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert done.returncode == 2 and "nowhere" in done.stderr
    # a value that starts with '-' reaches its check (argparse alone says "expected one argument")
    done = dpadmm("privacy", "--algorithm", "admm-sharing", "--parties", "-1,124", cwd=tmp_path)
    assert done.returncode == 2 and "parties='-1,124' is not allowed; give comma-separated" in done.stderr
    done = dpadmm("train", "--rounds", "-3", cwd=tmp_path)
    assert done.returncode == 2 and "rounds=-3 is not allowed; it must be >= 1" in done.stderr


def test_privacy_prints_the_ledger_without_training(tmp_path: Path, dpadmm: Run) -> None:
    done = dpadmm("privacy", "--preset", "papers", "--algorithm", "objpm", "--epsilon", "0.05",
                  "--local-steps", "10",
                  "--rounds", "20000", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ledger = json.loads(done.stdout)
    assert {"per_step", "per_round", "whole_run"} <= ledger.keys()
    assert ledger["whole_run"]["delta"] == 1e-5 and 339 < ledger["whole_run"]["epsilon_pld"] < 340
    assert not list(tmp_path.iterdir())  # nothing trained, nothing written
    text = dpadmm("privacy", "--preset", "papers", "--algorithm", "objp", "--sensitivity", "data-dependent",
                  cwd=tmp_path)
    assert "per run" in text.stdout and "NOT COVERED" in text.stdout
    bad = dpadmm("privacy", "--target-epsilon", "1e-9", cwd=tmp_path)
    assert bad.returncode == 2 and "smallest achievable value" in bad.stderr


def test_reproduce_errors_are_named(tmp_path: Path, dpadmm: Run) -> None:
    done = dpadmm("reproduce", "--datasets", "femnist", cwd=tmp_path)
    assert done.returncode == 2 and "--femnist-dir" in done.stderr
    done = dpadmm("reproduce", "--eps", "0.1,abc", cwd=tmp_path)
    assert done.returncode == 2 and "eps='0.1,abc'" in done.stderr
    done = dpadmm("reproduce", "--report-only", "--out", "empty", cwd=tmp_path)
    assert done.returncode == 2 and "no reproduce runs" in done.stderr
    (tmp_path / "other").mkdir()  # another paper's grid, --paper forgotten
    (tmp_path / "other" / "grid.json").write_text("{}\n")
    done = dpadmm("reproduce", "--report-only", "--out", "other", cwd=tmp_path)
    assert done.returncode == 2 and "another paper's grid (grid.json): give its --paper" in done.stderr


def test_a_file_given_as_data_dir_is_named(tmp_path: Path, dpadmm: Run) -> None:
    (tmp_path / "a-file").write_text("")
    done = dpadmm("train", "--dataset", "mnist", "--data-dir", "a-file", "--no-progress", cwd=tmp_path)
    assert done.returncode == 2 and "a-file is not a folder" in done.stderr


_HEAVY = ("torch", "numpy", "dp_accounting", "flwr", "matplotlib")


def _imported_by(code: str) -> list[str]:
    """The heavy packages a fresh interpreter has imported after running code."""
    probe = code + f"\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & "\
                   f"{set(_HEAVY)!r})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_imports_nothing_heavy_and_privacy_no_torch() -> None:
    """`dpadmm --help` builds every subcommand's parser without torch, numpy or dp-accounting (it answers
    in a tenth of a second), and `dpadmm privacy` needs dp-accounting but not torch."""
    assert _imported_by("from dpadmm import cli\ncli.build_parser().format_help()") == []
    for argv in (["privacy", "--preset", "papers", "--algorithm", "objpm", "--epsilon", "0.5"],
                 ["privacy", "--algorithm", "dp-admm"]):  # the main job's family and paper 002's
        imported = _imported_by(f"from dpadmm import cli\ncli.main({argv!r})")
        assert "torch" not in imported and "dp_accounting" in imported, (argv, imported)


def test_train_and_privacy_run_the_family_that_algorithm_picks(tmp_path: Path, binary_dir: Path,
                                                               dpadmm: Run) -> None:
    """--algorithm dp-admm / dp-accadmm takes paper 002's keys; the files are the same kind."""
    done = dpadmm("train", "--algorithm", "dp-accadmm", "--restart", "goldstein", "--dataset", "ijcnn1",
                  "--data-dir", str(binary_dir / "ijcnn1"), "--rounds", "6", "--eval-every", "3",
                  "--target-epsilon", "0.1", "--out", "r", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [3, 6] and 0.5 < lines[-1]["test-accuracy"] <= 1
    assert json.loads((tmp_path / "r" / "privacy.json").read_text())["calibration"] == "Theorem 1 (002)"
    assert "dp-accadmm (eps=0.1 for the run, ijcnn1, T=6)" in done.stdout
    done = dpadmm("privacy", "--algorithm", "dp-admm", "--dataset", "a9a", "--target-epsilon", "0.1",
                  "--rounds", "100", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sigma = 0.0114565 on the mean gradient" in done.stdout and "n = 32561" in done.stdout
    help_text = dpadmm("train", "--algorithm", "dp-admm", "--help", cwd=tmp_path).stdout
    assert "--target-epsilon" in help_text and "--local-steps" not in help_text
    done = dpadmm("train", "--algorithm", "dp-admm", "--local-steps", "3", cwd=tmp_path)
    assert done.returncode == 2 and "unrecognized arguments: --local-steps" in done.stderr
    done = dpadmm("train", "--algorithm", "admm", cwd=tmp_path)
    allowed = "choose one of iadmm, objp, objpm, objt, outp, dp-admm, dp-accadmm"
    assert done.returncode == 2 and allowed in done.stderr


def test_reproduce_002_has_its_own_flags_and_names_its_errors(tmp_path: Path, dpadmm: Run) -> None:
    shown = dpadmm("reproduce", "--paper", "002", "--help", cwd=tmp_path)
    assert shown.returncode == 0 and "--fig1-eps" in shown.stdout and "--femnist-dir" not in shown.stdout
    assert "--femnist-dir" in dpadmm("reproduce", "--help", cwd=tmp_path).stdout  # 003 stays the default
    done = dpadmm("reproduce", "--paper", "002", "--data-dir", ".", "--rounds", "10,x", cwd=tmp_path)
    assert done.returncode == 2 and "rounds='10,x'" in done.stderr
    done = dpadmm("reproduce", "--paper", "002", "--data-dir", ".", "--datasets", "mnist", cwd=tmp_path)
    assert done.returncode == 2 and "datasets='mnist' is not allowed" in done.stderr
    done = dpadmm("reproduce", "--paper", "005", cwd=tmp_path)
    assert done.returncode == 2 and "invalid choice: '005'" in done.stderr


@pytest.mark.slow  # a grid of several cells through the CLI, and its report rebuilt
def test_reproduce_001_runs_a_small_grid_and_rebuilds_its_report(tmp_path: Path, binary_dir: Path,
                                                                 dpadmm: Run) -> None:
    shown = dpadmm("reproduce", "--paper", "001", "--help", cwd=tmp_path)
    assert shown.returncode == 0 and "--sigmas" in shown.stdout and "--fig1-eps" not in shown.stdout
    data = ("--data-dir", str(binary_dir))
    done = dpadmm("reproduce", "--paper", "001", *data, "--sigmas", "1,x", cwd=tmp_path)
    assert done.returncode == 2 and "sigmas='1,x' is not allowed; give comma-separated numbers" in done.stderr
    small = (*data, "--datasets", "a9a", "--epochs", "2", "--sigmas", "1", "--seeds", "1", "--rates", "1",
             "--rhos", "2", "--out", "r", "--no-progress")
    done = dpadmm("reproduce", "--paper", "001", *small, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "a9a/ADMM/paper-noise/sigma=1/rho=2: complete" in done.stdout and "report:" in done.stdout
    # the estimated wall time comes first, before any run
    estimated = done.stdout.index("reproduce: estimated wall time about ")
    assert estimated < done.stdout.index("a9a/problem: running") and "--no-estimate" in shown.stdout
    assert "--workers" in shown.stdout and "--ray-address" in shown.stdout
    done = dpadmm("reproduce", "--paper", "001", *small, "--workers", "0", cwd=tmp_path)
    assert done.returncode == 2 and "workers=0 is not allowed" in done.stderr
    (tmp_path / "r" / "summary.md").unlink()
    done = dpadmm("reproduce", "--paper", "001", "--out", "r", "--report-only", cwd=tmp_path)
    assert done.returncode == 0 and "## The paper's claims" in (tmp_path / "r" / "summary.md").read_text()


@pytest.mark.slow
def test_a_grid_whose_cells_failed_says_so_first_and_its_report_only_fails(tmp_path: Path, binary_dir: Path,
                                                                           dpadmm: Run) -> None:
    """Every cell failing (a damaged a9a) leaves a report whose first line names the failed cells, and
    `--report-only` on that folder exits 1; the same command with the data repaired completes and clears
    it."""
    data = tmp_path / "data" / "a9a"
    data.mkdir(parents=True)
    for name in ("a9a.gz", "a9a.t.gz"):
        shutil.copy(binary_dir / "a9a" / name, data / name)
    truncated(data / "a9a.gz")
    small = ("--data-dir", str(tmp_path / "data"), "--datasets", "a9a", "--epochs", "2", "--sigmas", "1",
             "--seeds", "1", "--rates", "1", "--rhos", "2", "--out", "r", "--no-progress", "--no-estimate")
    done = dpadmm("reproduce", "--paper", "001", *small, cwd=tmp_path)
    assert done.returncode == 1 and "a9a/problem" in done.stderr, done.stderr
    summary = (tmp_path / "r" / "summary.md").read_text()
    first = summary.splitlines()[0]
    assert first.startswith("> **Incomplete**: 5 cells failed") and "`a9a/problem`: " in first  # every cell
    assert "cannot decompress the gzip data" in first
    again = dpadmm("reproduce", "--paper", "001", "--out", "r", "--report-only", cwd=tmp_path)
    assert again.returncode == 1 and "the grid in r is incomplete: 5 cells failed" in again.stderr
    assert (tmp_path / "r" / "summary.md").read_text().startswith("> **Incomplete")

    shutil.copy(binary_dir / "a9a" / "a9a.gz", data / "a9a.gz")  # repaired: the failed cells run again
    done = dpadmm("reproduce", "--paper", "001", *small, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "r" / "failed-cells.json").exists()
    assert not (tmp_path / "r" / "summary.md").read_text().startswith("> **Incomplete")
    assert dpadmm("reproduce", "--paper", "001", "--out", "r", "--report-only", cwd=tmp_path).returncode == 0


def test_admm_sharing_trains_and_states_its_privacy(tmp_path: Path, binary_dir: Path, dpadmm: Run) -> None:
    data = binary_dir / "a9a"
    done = dpadmm("train", "--algorithm", "admm-sharing", "--dataset", "a9a", "--data-dir", str(data),
                  "--parties", "66,57", "--epsilon", "inf", "--rounds", "20", "--out", "r", "--no-progress",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "admm-sharing (non-private, a9a, parties 66,57, T=20)" in done.stdout
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 20 and lines[-1]["test-error"] < 0.2
    ledger = dpadmm("privacy", "--algorithm", "admm-sharing", "--epsilon", "0.5", "--rounds", "20", "--json",
                    cwd=tmp_path)
    assert ledger.returncode == 0, ledger.stderr
    assert json.loads(ledger.stdout)["calibration"] == "Theorem 3 (001)"
    bad = dpadmm("train", "--algorithm", "admm-sharing", "--parties", "60,60", "--data-dir", str(data),
                 cwd=tmp_path)
    assert bad.returncode == 2 and "cover 120 columns but the data set has 123" in bad.stderr


def test_decentralised_ldp_admm_trains_and_states_its_privacy(tmp_path: Path, binary_dir: Path,
                                                              dpadmm: Run) -> None:
    done = dpadmm("train", "--algorithm", "ldp-admm", "--data-dir", str(binary_dir / "adult"), "--rounds",
                  "20", "--out", "r", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ldp-admm (random weights, Laplace" in done.stdout and "ex-post loss" in done.stdout
    assert "-LDP, pure, a priori" in done.stdout and "NOT COVERED" not in done.stdout
    shown = dpadmm("privacy", "--algorithm", "ldp-admm", "--sensitivity", "0.01", cwd=tmp_path)
    assert shown.returncode == 0 and "4.45868-LDP" in shown.stdout and "NOT COVERED" in shown.stdout
    done = dpadmm("train", "--algorithm", "ldp-dgd", cwd=tmp_path)
    assert done.returncode == 2 and "needs graph='complete'" in done.stderr


def test_privacy_answers_for_any_count_of_releases(tmp_path: Path, dpadmm: Run) -> None:
    """Ten million Laplace releases (10 steps a round, a million rounds): a statement in seconds, with the
    bound named, where the PLD accountant alone ran for minutes."""
    started = time.monotonic()
    done = dpadmm("privacy", "--preset", "papers", "--algorithm", "objpm", "--epsilon", "0.05",
                  "--local-steps", "10", "--rounds", "1000000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60
    assert "per run        (10000000 releases): eps = 1.363e+04 (RDP; the PLD accountant is too slow" \
        in done.stdout


def test_a_refused_train_leaves_no_run_folder(tmp_path: Path, binary_dir: Path, dpadmm: Run) -> None:
    """Widths that miss columns, and a data file that cannot be read, are refused on one line before the
    run's folder is made: nothing is left that looks like a run (config.json, privacy.json, metrics.jsonl)."""
    import gzip
    import shutil

    done = dpadmm("train", "--algorithm", "admm-sharing", "--dataset", "a9a", "--data-dir",
                  str(binary_dir / "a9a"), "--parties", "60,57", "--epsilon", "1", "--no-progress",
                  cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.splitlines() == ["dpadmm: error: parties='60,57' cover 117 "
                                                                 "columns but the data set has 123; give "
                                                                 "widths that sum to 123"]
    corrupted = tmp_path / "a9a"  # a copy of the real a9a whose line 17 names column 130 of 123
    corrupted.mkdir()
    shutil.copy(binary_dir / "a9a" / "a9a.t.gz", corrupted)
    lines = gzip.decompress((binary_dir / "a9a" / "a9a.gz").read_bytes()).decode().splitlines(keepends=True)
    lines[16] = lines[16].rstrip("\n") + " 130:1\n"
    (corrupted / "a9a.gz").write_bytes(gzip.compress("".join(lines).encode()))
    done = dpadmm("train", "--algorithm", "dp-admm", "--dataset", "a9a", "--data-dir", str(corrupted),
                  "--rounds", "2", "--no-progress", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "line 17" in done.stderr and "130" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a9a"]  # no runs/ folder


def _strict_json(text: str) -> dict:
    """JSON as the standard has it: NaN and Infinity, which Python would print and read back, refused."""
    def refuse(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_privacy_states_no_impossible_guarantee_in_any_family(capsys: pytest.CaptureFixture[str]) -> None:
    """The reported sharing run printed "(411.518, 2)-DP"; a delta the grid alone spends, an overflowing
    rate and targets below what the deployed noise costs printed inf, Infinity or a traceback. Each is now
    stated as no guarantee (valid JSON), or refused on one line that names the value (in process: the
    console script's main)."""
    from dpadmm.cli import main

    assert main(["privacy", "--algorithm", "admm-sharing", "--epsilon", "1", "--delta", "0.01", "--rounds",
                 "200", "--json"]) == 0
    note = _strict_json(capsys.readouterr().out)["note"]
    assert "2)-DP" not in note and "Corollary 1 (eq. (17)) gives no guarantee here" in note
    assert main(["privacy", "--target-epsilon", "0", "--epsilon", "1", "--delta", "1e-300", "--json"]) == 0
    run = _strict_json(capsys.readouterr().out)["whole_run"]
    assert run["epsilon_pld"] is None and run["method"].startswith("no guarantee: at delta=1e-300")
    for args, named in [
        (("--algorithm", "ldp-admm", "--rounds", "40000"), "noise-growth=1.02 over 40000 rounds"),
        (("--algorithm", "dp-admm", "--target-epsilon", "1e-300"), "target-epsilon=1e-300 cannot be"),
        (("--algorithm", "admm-sharing", "--epsilon", "1e-300"), "epsilon=1e-300 is not achievable"),
        (("--target-epsilon", "1e-12", "--delta", "1e-300"), "target-epsilon=1e-12 is not achievable"),
        (("--preset", "papers", "--epsilon", "5e-324"), "epsilon=5e-324 is not allowed"),
    ]:
        assert main(["privacy", *args]) == 2, args
        refused = capsys.readouterr()
        assert refused.out == "" and refused.err.splitlines() == [refused.err.strip()], refused.err
        assert named in refused.err, refused.err


def test_privacy_answers_fast_where_the_pld_of_one_release_took_minutes(tmp_path: Path, dpadmm: Run) -> None:
    """The main job with eps-bar 50 set directly: 150 s before (a sampled release's PLD of multiplier 0.02,
    built for every scope)."""
    started = time.monotonic()
    done = dpadmm("privacy", "--target-epsilon", "0", "--epsilon", "50", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60
    assert "(100 releases): eps = 1.358e+05 (RDP; the PLD accountant is too slow" in done.stdout


@pytest.mark.parametrize("args", [["--rounds", "2"],
                                  ["--preset", "papers", "--algorithm", "objp", "--epsilon", "1"],
                                  ["--algorithm", "dp-admm", "--target-epsilon", "5", "--rounds", "2"],
                                  ["--algorithm", "admm-sharing"],
                                  ["--algorithm", "ldp-admm", "--weights", "fixed", "--target-epsilon", "2",
                                   "--rounds", "1"]],
                         ids=["main-job", "objp", "dp-admm", "admm-sharing", "ldp-admm"])
def test_audit_prints_one_object_per_release_kind(args: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`dpadmm audit --json`: claim, bound, trials and seconds per audited kind of release, for every family;
    the real code's bound never above its claim."""
    from dpadmm.cli import main

    assert main(["audit", *args, "--trials", "4000", "--json"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert results
    for result in results:
        assert {"claim", "bound", "trials", "seconds", "kind", "attack"} <= result.keys()
        # a release audit observes --trials releases; the one-run audit, one run of its canaries
        assert result["trials"] == result.get("canaries", 4000), result
        assert 0 <= result["bound"] <= result["claim"] and result["seconds"] > 0
    assert main(["audit", *args, "--trials", "4000"]) == 0
    assert "audit lower bound" in capsys.readouterr().out


def test_audit_refuses_what_it_cannot_audit(capsys: pytest.CaptureFixture[str]) -> None:
    from dpadmm.cli import main

    assert main(["audit", "--trials", "10"]) == 2
    assert "--trials 10 is not allowed" in capsys.readouterr().err
    assert main(["audit", "--trials", str(10**12)]) == 2  # not a memory error after minutes
    assert "--trials 1000000000000 is not allowed; it must be in 100..10,000,000" in capsys.readouterr().err
    assert main(["audit", "--alpha", "1.5"]) == 2
    assert "--alpha 1.5 is not allowed" in capsys.readouterr().err
    assert main(["audit", "--preset", "papers", "--algorithm", "iadmm"]) == 2
    assert "no privacy claim to audit" in capsys.readouterr().err
    assert main(["audit", "--algorithm", "dp-admm", "--target-epsilon", "inf"]) == 2
    assert "no privacy claim to audit" in capsys.readouterr().err


def test_an_answer_to_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`dpadmm node status | head -1`: the reader closed its end before the answer was flushed; the command
    ends without an error line (it said "[Errno 32] Broken pipe"), as `ls | head` does."""
    script = Path(sys.executable).with_name("dpadmm")
    proc = subprocess.Popen([str(script), "node", "status", "--state-dir", str(tmp_path / "state")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before anything was read: the answer's flush meets a closed pipe
    said = proc.stderr.read()
    assert proc.wait(timeout=120) in (0, -signal.SIGPIPE) and said == "", said


def test_node_policy_and_status_are_the_devices_own(tmp_path: Path, dpadmm: Run) -> None:
    """`dpadmm node policy --write` writes the defaults once; `status` says what is spent, and refuses a
    damaged budget with the reason (exit 2, one line)."""
    state = tmp_path / "state"
    written = dpadmm("node", "policy", "--state-dir", str(state), "--write", cwd=tmp_path)
    assert written.returncode == 0 and written.stdout.strip() == str(state / "policy.toml")
    assert "max-run-epsilon = 8.0" in (state / "policy.toml").read_text()
    again = dpadmm("node", "policy", "--state-dir", str(state), "--write", cwd=tmp_path)
    assert again.returncode == 2 and "policy.toml exists; edit it, or remove it first" in again.stderr
    shown = dpadmm("node", "status", "--state-dir", str(state), cwd=tmp_path)
    assert shown.returncode == 0 and "no agent has answered on this device: nothing spent" in shown.stdout
    (state / "agent-0.budget.jsonl").write_text("not json\n")
    damaged = dpadmm("node", "status", "--state-dir", str(state), cwd=tmp_path)
    assert damaged.returncode == 2 and damaged.stderr.startswith("dpadmm: error: the budget file")
    assert "is damaged at line 1" in damaged.stderr and len(damaged.stderr.splitlines()) == 1


def test_node_serve_refuses_an_address_it_would_retry_forever(tmp_path: Path, dpadmm: Run) -> None:
    """A runtime API address that is no HOST:PORT (or a port out of range) was retried forever, and the
    killed process exited 0; it is checked as `dpadmm deploy supernode` checks its SuperLink's."""
    refused = _script("node", "serve", "--runtime-api-address", "foo", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr == (
        "dpadmm: error: runtime-api-address='foo' is not allowed; give the SuperNode's runtime API, "
        "HOST:PORT with the port in 1..65535 (the SuperNode's --port), e.g. 127.0.0.1:9094\n")
    port = dpadmm("node", "serve", "--runtime-api-address", "127.0.0.1:99999", cwd=tmp_path)
    assert port.returncode == 2 and port.stderr.startswith(
        "dpadmm: error: runtime-api-address='127.0.0.1:99999' is not allowed; give the SuperNode's")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
@pytest.mark.parametrize("command", [("train",), ("train", "--algorithm", "ldp-admm"),
                                     ("reproduce", "--paper", "004", "--out", "r")])
def test_cuda_where_there_is_none_is_one_line(command: tuple[str, ...], tmp_path: Path, dpadmm: Run) -> None:
    """--device cuda on a machine without a GPU used to fail in every round (or every grid cell, each told to
    retry) with torch's traceback; it is refused before anything is written."""
    done = dpadmm(*command, "--device", "cuda", cwd=tmp_path)
    assert done.returncode == 2 and "device='cuda' is not available here" in done.stderr
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir())


@pytest.mark.parametrize(("family", "flag", "value"), [
    ("objpm", "--out", "x"), ("dp-admm", "--data-dir", "nowhere"), ("admm-sharing", "--eval-every", "3"),
    ("ldp-admm", "--round-timeout", "5"),
])
def test_audit_refuses_what_it_would_ignore(family: str, flag: str, value: str, tmp_path: Path,
                                            dpadmm: Run) -> None:
    """`dpadmm audit` takes the run's flags of its family, but reads neither data nor outputs: an --out or a
    --data-dir given to it used to be silently ignored."""
    done = dpadmm("audit", "--algorithm", family, "--trials", "100", flag, value, cwd=tmp_path)
    assert done.returncode == 2 and "is not read by dpadmm audit" in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())
