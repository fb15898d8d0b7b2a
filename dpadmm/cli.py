"""The ``dpadmm`` command line: ``dpadmm train`` runs the batched engine, ``dpadmm privacy``
prints a configuration's privacy ledger, ``dpadmm audit`` attacks its releases and bounds their epsilon
from below, ``dpadmm reproduce`` reruns the papers' grid, and
``dpadmm deploy`` sets up a secure Flower deployment (development CA, SuperNode keys, the
``flwr`` connection, and the ``flower-superlink`` / ``flower-supernode`` commands).

The flags of ``train``, ``privacy`` and ``audit`` are the run-config keys of the Flower app
(``--local-steps`` is ``local-steps``), generated from the configuration class of the family
that ``--algorithm`` picks (:mod:`dpadmm.families`; DP-IADMM's by default), so the two cannot
drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import tomllib
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from dpadmm import keys
from dpadmm.families import ALGORITHMS, DEFAULT, Family, family_of
from dpadmm.files import write_atomic
from dpadmm.iadmm import config as iadmm_config
from dpadmm.iadmm.config import PRESETS, requested
from dpadmm.runs.memory import keep_freed_memory

_T = TypeVar("_T")


def _add_config_flags(parser: argparse.ArgumentParser, family: Family) -> None:
    """One flag per configuration field. A flag left out is None, so that the default family can tell the
    flags given from those left out (:func:`dpadmm.iadmm.config.requested`): the preset fills only those."""
    papers = iadmm_config.PAPERS if family is DEFAULT else {}
    if family is DEFAULT:
        parser.add_argument("--preset", choices=PRESETS, default=PRESETS[0],
                            help="the values of the flags left out: main (the main job, budget-first: "
                                 "the whole run (8, 1e-5)-DP per agent) or papers (the papers' settings: "
                                 "eps-bar per local step, full batches, Laplace noise); a flag given is used "
                                 "as given (default: main)")
    for f in dataclasses.fields(family.config):
        flag = "--" + f.name.replace("_", "-")
        default = f"{f.default!r}"
        if f.name in papers:
            default = f"{f.default!r}; the papers preset's {papers[f.name]!r}"
        help_text = f"{f.metadata.get('help', '')} (default: {default})"
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            type_name = f.type if isinstance(f.type, str) else f.type.__name__
            kind = {"int": int, "float": float}.get(type_name, str)
            parser.add_argument(flag, type=kind, default=None, help=help_text, metavar=f.name.upper())


def _config_from(args: argparse.Namespace, family: Family) -> Any:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(family.config)
             if getattr(args, f.name) is not None}
    if family is DEFAULT:
        return requested({name.replace("_", "-"): value for name, value in given.items()}, args.preset)
    return family.config(**given)


def _family_in(argv: Sequence[str]) -> Family:
    """The family of the ``--algorithm`` in ``argv`` (the default family's without one); an unknown
    algorithm is left for the family's parser to report with every allowed value."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--algorithm", default=None)
    algorithm = peek.parse_known_args(list(argv))[0].algorithm
    try:
        return DEFAULT if algorithm is None else family_of(algorithm)
    except ValueError:
        return DEFAULT


_FAMILY_NOTE = ("The flags are the run-config keys of the family that --algorithm picks ({algorithms}); "
                "this list is {family}'s: add --algorithm to see another's.")


def build_parser(family: Family = DEFAULT, paper: str = "003") -> argparse.ArgumentParser:
    from dpadmm.families import ALGORITHMS

    parser = argparse.ArgumentParser(
        prog="dpadmm",
        description="Differentially private federated learning via ADMM, on Flower.",
    )
    note = _FAMILY_NOTE.format(algorithms=", ".join(ALGORITHMS), family=family.papers)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train",
        help="run an algorithm with every agent batched on one device",
        description="Run an algorithm with every agent (or every run) batched on one device; writes "
                    "<out>/config.json, <out>/privacy.json and <out>/metrics.jsonl. " + note,
    )
    _add_config_flags(train, family)
    train.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    if family is DEFAULT:
        train.add_argument("--checkpoint-minutes", type=float, default=5.0,
                           help="save the run's state into its folder this often (at an evaluated round); "
                                "interrupted (Ctrl-C, SIGTERM), the same command resumes from there; 0 = "
                                "never, and an interrupted run starts again from round 1 (default: 5)")
    ledger = commands.add_parser(
        "privacy",
        help="print the privacy ledger of a configuration without training",
        description="Print what a configuration guarantees per local step, per round and for the whole "
                    "run (PLD, RDP, basic and advanced composition), without training. " + note,
    )
    _add_config_flags(ledger, family)
    ledger.add_argument("--json", action="store_true", help="print the ledger as one JSON object")
    audit = commands.add_parser(
        "audit",
        help="attack a configuration's releases and set the empirical epsilon lower bound beside the claim",
        description="Attack each kind of release of a configuration with the code that trains (its keyed "
                    "noise, its clipping), on the worst-case neighbours of the family's relation, and print "
                    "the ledger's epsilon for one release beside the empirical lower bound (Clopper-Pearson "
                    "at the confidence asked). A bound above the claim refutes it. " + note,
    )
    _add_config_flags(audit, family)
    audit.add_argument("--trials", type=int, default=200_000,
                       help="releases observed on each neighbour (default: 200000; more tighten the bound)")
    audit.add_argument("--alpha", type=float, default=0.05,
                       help="the bound fails to hold with probability at most alpha (default: 0.05)")
    audit.add_argument("--json", action="store_true",
                       help="print one JSON object per audited release kind (claim, bound, trials, seconds)")
    _add_reproduce(commands, paper)
    _add_deploy(commands)
    _add_node(commands)
    _add_data(commands)
    return parser


def _add_data(commands: argparse._SubParsersAction) -> None:
    from dpadmm.data.sources import SOURCES

    data = commands.add_parser(
        "data", help="fetch the data sets into the cache",
        description="Fetch data sets from their public sources into the cache ($DPADMM_CACHE, else "
                    "~/.cache/dpadmm), each file checked by the SHA-256 of its content; a command without "
                    "--data-dir reads them there. $DPADMM_DATA_MIRRORS (comma-separated base URLs laid out "
                    "as <base>/<name>/<file>, file:// included) replaces the public sources.")
    steps = data.add_subparsers(dest="step", required=True)
    fetch = steps.add_parser("fetch", help="fetch one data set, or all", description=(
        "Fetch a data set (or all) into the cache; files already there are kept. Data sets: "
        + "; ".join(f"{s.name}: {s.title}" for s in SOURCES.values()) + "."))
    fetch.add_argument("name", choices=[*SOURCES, "all"], metavar="NAME|all",
                       help=f"one of {', '.join(SOURCES)}, or all")
    fetch.add_argument("--dir", default=None,
                       help="fetch into this folder instead (the data set's own folder; one data set only)")
    fetch.add_argument("--no-progress", action="store_true", help="do not show the progress bars")


# dpadmm reproduce --paper: Ryu & Kim's grid (the default), Xu et al.'s, Hu et al.'s, Xiao et al.'s figures
PAPERS = ("003", "002", "001", "004")


def _paper_in(argv: Sequence[str]) -> str:
    """The ``--paper`` in ``argv`` (003 without one); an unknown value is left for the parser to report."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--paper", default=PAPERS[0])
    paper = peek.parse_known_args(list(argv))[0].paper
    return paper if paper in PAPERS else PAPERS[0]


def _add_reproduce(commands: argparse._SubParsersAction, paper: str) -> None:
    rep = commands.add_parser(
        "reproduce",
        help="rerun the papers' experiments and report them next to the papers' numbers",
        description="Rerun a paper's experiments, resuming where an earlier call stopped, and write the "
                    "results, summary.md and the figures into --out. --paper 003 (the default): Ryu & "
                    "Kim's grid (algorithms x eps-bar x data sets x seeds) with the papers' data-dependent "
                    "sensitivity. --paper 002: Xu et al.'s Fig. 1 and Fig. 2 (ADMM, AccADMM, DP-ADMM, "
                    "DP-AccADMM on four LIBSVM sets). --paper 001: Hu et al.'s Figs. 1-3 (ADMM sharing over "
                    "vertically split features against vertical SGD and scikit-learn, and under noise). "
                    "--paper 004: Xiao et al.'s Figs. 2, B, C, D (decentralised local DP on UCI Adult). The "
                    "flags below are this paper's; add --paper to see another's.",
    )
    rep.add_argument("--paper", choices=PAPERS, default=PAPERS[0],
                     help="003 (Ryu & Kim, DP-IADMM; default), 002 (Xu et al., DP-ADMM / DP-AccADMM), 001 "
                          "(Hu et al., ADMM sharing) or 004 (Xiao et al., decentralised local DP)")
    {"001": _add_reproduce_001, "002": _add_reproduce_002, "003": _add_reproduce_003,
     "004": _add_reproduce_004}[paper](rep)
    rep.add_argument("--workers", type=int, default=1,
                     help="cells run at once: 1 (default) one after another in this process; N > 1 on a "
                          "local Ray instance, each cell with --threads threads (the same results)")
    rep.add_argument("--ray-address", default="",
                     help="run the cells on the existing Ray cluster at this address (host:port, or auto: "
                          "RAY_ADDRESS or the cluster started on this machine); every node needs dpadmm and "
                          "the data, none needs this folder: results come back here")
    rep.add_argument("--threads", type=int, default=1,
                     help="threads per cell (default: 1). The numbers of a grid are the same for the same "
                          "--threads however many --workers run it; other threads may change last digits")
    rep.add_argument("--checkpoint-minutes", type=float, default=5.0,
                     help="a running cell saves its state this often; its worker lost, it resumes from there "
                          "(default: 5)")
    rep.add_argument("--report-only", action="store_true",
                     help="only rebuild the report from the completed cells")
    rep.add_argument("--no-progress", action="store_true", help="do not show progress bars")
    rep.add_argument("--no-estimate", action="store_true",
                     help="start at once, without first timing a few iterations of each kind of run to print "
                          "the estimated wall time")


def _add_reproduce_003(rep: argparse.ArgumentParser) -> None:
    from dpadmm.iadmm.reproduce import GridConfig

    d = GridConfig()
    rep.add_argument("--out", default=d.out, help=f"output folder (default: {d.out})")
    rep.add_argument("--datasets", default=",".join(d.datasets), help="comma-separated: mnist,femnist")
    rep.add_argument("--algorithms", default=",".join(d.algorithms),
                     help=f"comma-separated (default: {','.join(d.algorithms)})")
    rep.add_argument("--eps", default=",".join(f"{e:g}" for e in d.eps),
                     help="comma-separated eps-bar values of the private algorithms "
                          f"(default: {','.join(f'{e:g}' for e in d.eps)})")
    rep.add_argument("--trust-radii", default=",".join(d.trust_radii),
                     help="comma-separated objt trust radii, a cell each: paper (000's a/t^2), reference "
                          f"(the authors' code's constant a) (default: {','.join(d.trust_radii)})")
    rep.add_argument("--iadmm-steps", default=",".join(map(str, d.iadmm_steps)),
                     help="comma-separated local steps E of the non-private iadmm, a cell each "
                          f"(default: {','.join(map(str, d.iadmm_steps))})")
    rep.add_argument("--seeds", type=int, default=d.seeds, help=f"seeds 0..N-1 per cell (default: {d.seeds})")
    rep.add_argument("--rounds", type=int, default=d.rounds, help=f"rounds T (default: {d.rounds})")
    rep.add_argument("--eval-every", type=int, default=d.eval_every,
                     help="evaluate every this many rounds; 0 = about 100 evaluations per run")
    rep.add_argument("--mnist-dir", default=d.mnist_dir,
                     help="folder with the MNIST IDX files; empty = download into the cache")
    rep.add_argument("--femnist-dir", default=d.femnist_dir, help="LEAF FEMNIST sample folder(s)")
    rep.add_argument("--dtype", default=d.dtype, help=f"float32 or float64 (default: {d.dtype})")
    rep.add_argument("--device", default=d.device, help=f"cpu or cuda (default: {d.device})")
    rep.add_argument("--delta", type=float, default=d.delta,
                     help=f"delta of the privacy columns (default: {d.delta:g})")


def _add_reproduce_002(rep: argparse.ArgumentParser) -> None:
    from dpadmm.linadmm.reproduce import Grid

    d = Grid()
    rep.add_argument("--out", default=d.out, help=f"output folder (default: {d.out})")
    rep.add_argument("--data-dir", default=d.data_dir,
                     help="folder with one sub-folder per data set, e.g. ../shared/data (a9a/a9a.gz, ...)")
    rep.add_argument("--datasets", default=",".join(d.datasets),
                     help=f"comma-separated (default: {','.join(d.datasets)})")
    rep.add_argument("--eps", default=",".join(f"{e:g}" for e in d.eps),
                     help="comma-separated whole-run eps of Fig. 2 (default: 0.01,...,0.1)")
    rep.add_argument("--fig1-eps", type=float, default=d.fig1_eps,
                     help=f"eps of the private runs of Fig. 1 (default: {d.fig1_eps:g})")
    rep.add_argument("--rounds", default=",".join(map(str, d.rounds)),
                     help="comma-separated iteration counts T, every eps at each; Fig. 1 runs the largest "
                          f"(default: {','.join(map(str, d.rounds))})")
    rep.add_argument("--seeds", type=int, default=d.seeds,
                     help=f"seeds per private cell (default: {d.seeds})")
    rep.add_argument("--eta", type=float, default=d.eta,
                     help="step size of every run; 0 = 1/L_f per data set, Lemma 5's largest (default: 0)")
    rep.add_argument("--optimum-rounds", type=int, default=d.optimum_rounds,
                     help="iterations of the long non-private runs that check the reference solver's optimum "
                          f"(default: {d.optimum_rounds})")
    rep.add_argument("--dtype", default=d.dtype, help=f"float64 or float32 (default: {d.dtype})")
    rep.add_argument("--device", default=d.device, help=f"cpu or cuda (default: {d.device})")


def _add_reproduce_001(rep: argparse.ArgumentParser) -> None:
    from dpadmm.sharing.reproduce import Grid

    d = Grid()
    rep.add_argument("--out", default=d.out, help=f"output folder (default: {d.out})")
    rep.add_argument("--data-dir", default=d.data_dir,
                     help="folder with a9a/ (a9a, a9a.t) and mnist/ (the MNIST IDX files), e.g. "
                          "../shared/data")
    rep.add_argument("--datasets", default=",".join(d.datasets),
                     help=f"comma-separated (default: {','.join(d.datasets)}; mnist-4v9 stands in for "
                          "gisette)")
    rep.add_argument("--epochs", type=int, default=d.epochs,
                     help=f"epochs of ADMM (rounds) and of SGD (passes) (default: {d.epochs})")
    rep.add_argument("--sigmas", default=",".join(f"{s:g}" for s in d.sigmas),
                     help="comma-separated noise levels of Fig. 3, in message units, each in both noise "
                          f"modes (default: {','.join(f'{s:g}' for s in d.sigmas)})")
    rep.add_argument("--eps", default=",".join(f"{e:g}" for e in d.eps),
                     help="comma-separated per-round eps in (0, 1]: message noise at Theorem 3's sigma for "
                          f"each (default: {','.join(f'{e:g}' for e in d.eps)})")
    rep.add_argument("--seeds", type=int, default=d.seeds, help=f"seeds per noisy cell (default: {d.seeds})")
    rep.add_argument("--rates", default=",".join(f"{r:g}" for r in d.rates),
                     help="comma-separated SGD learning rates; the report takes the one with the lowest "
                          f"final training objective (default: {','.join(f'{r:g}' for r in d.rates)})")
    rep.add_argument("--rhos", default=",".join(f"{r:g}" for r in d.rhos),
                     help="comma-separated ADMM penalties rho in units of 1/(4N), each >= 1; the report "
                          "takes the one with the lowest final training objective (default: "
                          f"{','.join(f'{r:g}' for r in d.rhos)})")
    rep.add_argument("--batch", type=int, default=d.batch, help=f"SGD mini-batch size (default: {d.batch})")
    rep.add_argument("--delta", type=float, default=d.delta, help=f"delta per round (default: {d.delta:g})")
    rep.add_argument("--dtype", default=d.dtype, help=f"float64 or float32 (default: {d.dtype})")
    rep.add_argument("--device", default=d.device, help=f"cpu or cuda (default: {d.device})")


def _add_reproduce_004(rep: argparse.ArgumentParser) -> None:
    from dpadmm.decentral.reproduce import Grid

    d = Grid()
    rep.add_argument("--out", default=d.out, help=f"output folder (default: {d.out})")
    rep.add_argument("--data-dir", default=d.data_dir,
                     help="folder with UCI Adult's adult.data and adult.test, e.g. ../shared/data/adult")
    rep.add_argument("--figures", default=",".join(d.figures),
                     help=f"comma-separated (default: {','.join(d.figures)})")
    rep.add_argument("--seeds", type=int, default=d.seeds,
                     help=f"runs per cell, each with its own graph and samples (default: {d.seeds})")
    rep.add_argument("--rounds", type=int, default=d.rounds, help=f"iterations K (default: {d.rounds})")
    rep.add_argument("--dtype", default=d.dtype, help=f"float64 or float32 (default: {d.dtype})")
    rep.add_argument("--device", default=d.device, help=f"cpu or cuda (default: {d.device})")


def _engine(family: str, module: str = "engine") -> Any:
    """``dpadmm.<family>.<module>``, which imports torch (seconds on a cold start): Ctrl-C or SIGTERM during
    that import ends in one line, as nothing was written yet, not in the tracebacks of a half-imported
    torch."""
    try:
        return importlib.import_module(f"dpadmm.{family}.{module}")
    except KeyboardInterrupt:
        print("dpadmm: interrupted before the run started; nothing was written", file=sys.stderr)
        raise SystemExit(130) from None


def _reproduce(args: argparse.Namespace) -> int:
    family = {"004": "decentral", "001": "sharing", "002": "linadmm"}.get(args.paper, "iadmm")
    reproduce = _engine(family, "reproduce")

    from dpadmm.runs.grid import CellsFailed, GridOptions, mark_report

    runner = ("workers", "ray_address", "threads", "checkpoint_minutes")
    options = {k: v for k, v in vars(args).items()
               if k not in ("command", "paper", "report_only", "no_progress", "no_estimate", *runner)}
    try:
        if args.report_only:
            out = Path(args.out)
            if not out.is_dir() or not any(out.iterdir()):
                raise FileNotFoundError(f"{out} holds no reproduce runs")
            if args.paper in ("001", "002", "004"):
                reproduce.write_report(out)
            else:
                if not (out / "runs").is_dir():
                    other = (" but another paper's grid (grid.json): give its --paper, 001, 002 or 004"
                             if (out / "grid.json").exists() else "")
                    raise FileNotFoundError(f"{out} holds no reproduce runs of paper 003 (no runs/ "
                                            f"folder){other}")
                reproduce.write_report(out, args.delta)
            why = mark_report(out)  # of the last call that ran cells
            if why:
                print(f"dpadmm: error: the grid in {out} is incomplete: {why}; the report says so first",
                      file=sys.stderr)
                print(f"report of the completed cells: {(out / 'summary.md').resolve()}")
                return 1
        else:
            grid = reproduce.grid_from_args(**options)
            how = GridOptions(workers=args.workers, ray_address=args.ray_address, threads=args.threads,
                              checkpoint_seconds=60 * args.checkpoint_minutes, progress=not args.no_progress)
            if not args.no_estimate:  # before the grid starts: the papers' defaults run for days (003)
                import torch

                print("reproduce: timing a few iterations of each kind of run to estimate the wall time ...",
                      flush=True)
                torch.set_num_threads(how.threads)  # probes at the cells' threads
                print(reproduce.estimate(grid).line(how.parallel()), flush=True)
            out = reproduce.run_grid(grid, how)
    except CellsFailed as err:  # the others completed and are in the report, which names the failed first
        mark_report(args.out)
        print(f"dpadmm: error: {err}", file=sys.stderr)
        print(f"report of the completed cells: {(Path(args.out) / 'summary.md').resolve()}")
        return 1
    except (ValueError, OSError) as err:  # OSError: missing or unreadable files
        print(f"dpadmm: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (main makes it the same): no traceback
        mark_report(args.out)
        print(f"dpadmm: interrupted; the cells completed so far are kept in {Path(args.out).resolve()}, and "
              "the same command runs the others (a cell in progress resumes from its last checkpoint)",
              file=sys.stderr)
        return 130
    print(f"report: {(out / 'summary.md').resolve()}")
    return 0


def _add_deploy(commands: argparse._SubParsersAction) -> None:
    from dpadmm.catalog import DATASET_NAMES as IADMM_DATASETS
    from dpadmm.deploy import CERT_DAYS
    from dpadmm.sharing.config import DATASETS

    deploy = commands.add_parser(
        "deploy",
        help="set up a secure Flower deployment (TLS certificates, SuperNode keys, commands)",
        description="Set up a Flower deployment that is secure by default: TLS with a development CA, "
                    "SuperNode authentication with registered keys, the flwr connection, and the "
                    "flower-superlink / flower-supernode commands. --insecure turns TLS and "
                    "authentication off, explicitly and with a warning.",
    )
    steps = deploy.add_subparsers(dest="step", required=True)
    certs = steps.add_parser("certs", help="make a development CA and the SuperLink's certificate",
                             description="Write ca.crt, server.crt and server.key (ECDSA P-384) into --out.")
    certs.add_argument("--out", required=True, help="folder to write into (existing files are refused)")
    certs.add_argument("--hosts", required=True,
                       help="comma-separated host names and IP addresses the SuperNodes use to reach the "
                            "SuperLink, e.g. 127.0.0.1,localhost,192.168.1.10")
    certs.add_argument("--days", type=int, default=CERT_DAYS,
                       help=f"validity of the certificates in days (default: {CERT_DAYS})")
    keys = steps.add_parser("keys", help="make one SuperNode authentication key pair per name",
                            description="Write <name> (private, mode 0600) and <name>.pub (OpenSSH, P-384) "
                                        "per name into --out.")
    keys.add_argument("--out", required=True, help="folder to write into (existing files are refused)")
    keys.add_argument("--names", required=True, help="comma-separated node names, e.g. node-0,node-1")
    link = steps.add_parser("superlink", help="run (or --print) the flower-superlink command",
                            description="Replace this process with flower-superlink, serving TLS with the "
                                        "certificates of --certs and accepting only registered SuperNodes.")
    link.add_argument("--certs", help="folder of `dpadmm deploy certs` (ca.crt, server.crt, server.key)")
    link.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    link.add_argument("--port", type=int, default=9093, help="port to listen on (default: 9093)")
    link.add_argument("--database", help="file that keeps the registered SuperNodes and runs across restarts")
    link.add_argument("--insecure", action="store_true",
                      help="no TLS, no SuperNode authentication (trusted test networks only)")
    link.add_argument("--print", action="store_true", help="print the command instead of running it")
    node = steps.add_parser("supernode", help="run (or --print) the flower-supernode command",
                            description="Replace this process with flower-supernode for one device.")
    node.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    node.add_argument("--node-config", required=True,
                      help="the agent's node config, e.g. \"partition-id=0 data-path='/x.npz' "
                           "num-samples-total=60000\"")
    node.add_argument("--ca-cert", help="the CA certificate that signed the SuperLink's (ca.crt)")
    node.add_argument("--key", help="this node's private key, registered with `flwr supernode register`")
    node.add_argument("--port", type=int, default=9094,
                      help="the node's local runtime API port, distinct per SuperNode on a machine "
                           "(default: 9094)")
    node.add_argument("--insecure", action="store_true",
                      help="no TLS, no SuperNode authentication (trusted test networks only)")
    node.add_argument("--print", action="store_true", help="print the command instead of running it")
    conn = steps.add_parser("connection", help="add a SuperLink connection to flwr's config.toml",
                            description="Append a [superlink.NAME] block to <flwr-home>/config.toml, so "
                                        "that `flwr run . NAME` reaches the SuperLink over TLS.")
    conn.add_argument("--name", required=True, help="connection name, e.g. dpadmm")
    conn.add_argument("--address", required=True, help="HOST:PORT of the SuperLink")
    conn.add_argument("--ca-cert", help="the CA certificate that signed the SuperLink's (ca.crt)")
    conn.add_argument("--insecure", action="store_true",
                      help="connect without TLS (trusted test networks only)")
    conn.add_argument("--flwr-home", help="Flower's home folder (default: $FLWR_HOME, else ~/.flwr)")
    conn.add_argument("--print", action="store_true", help="print the block instead of writing it")
    vertical = steps.add_parser(
        "vertical", help="write ADMM sharing's party files and labels file (001, vertical learning)",
        description="Cut a data set into party-<m>.npz per party (ids, x, test_ids, x_test: its column "
                    "block) and labels.npz (ids, y, test_ids, y_test) in --out, with ids = the row numbers. "
                    "Party m's SuperNode reads its own file (node config partition-id=<m> "
                    "data-path=<file>); the server reads the labels (run config sharing.labels-path). "
                    "Nothing is written unless a run could use the files: the widths must cover the "
                    "data set's columns exactly.")
    vertical.add_argument("--dataset", choices=DATASETS, default=DATASETS[0],
                          help=f"the data set (default: {DATASETS[0]})")
    vertical.add_argument("--data-dir", default="",
                          help="folder with the data set's files (default: the cache, fetched on first use)")
    vertical.add_argument("--parties", default="66,57",
                          help="comma-separated column counts of the parties' blocks (default: 66,57)")
    vertical.add_argument("--out", required=True, help="folder to write into (existing files are refused)")
    agents = steps.add_parser(
        "agents", help="write the agents' sample files (004, decentralised local DP)",
        description="Write agent-<i>.npz per agent (x: its rows of UCI Adult, the encoded columns in [0, 1]; "
                    "y: labels 0/1) in --out, the rows the run of --seed draws, so that a deployment equals "
                    "the simulation. Agent i's SuperNode reads its own file (node config partition-id=<i> "
                    "data-path=<file>); the server holds no data (run config decentral.data-dir=''). "
                    "Nothing is written unless a run could use the files.")
    agents.add_argument("--data-dir", default="", help="folder with adult.data and adult.test (or .gz; "
                                                       "default: the cache, fetched on first use)")
    agents.add_argument("--agents", type=int, default=10,
                        help="N, the number of agents, at least 3 (default: 10)")
    agents.add_argument("--samples", type=int, default=100,
                        help="b_i, the samples of each, at least 1 (default: 100)")
    agents.add_argument("--seed", type=int, default=0,
                        help="the run's seed, which draws the rows (default: 0)")
    agents.add_argument("--partition", default="contiguous",
                        help="how the drawn rows are dealt: contiguous (the paper's IID agents), "
                             "dirichlet:ALPHA or shards:K (label skew, b each; default: contiguous)")
    agents.add_argument("--out", required=True, help="folder to write into (existing files are refused)")
    parts = steps.add_parser(
        "partitions", help="write the agents' data files of DP-IADMM (its simulation's partition)",
        description="Write agent-<p>.npz per agent (x: its samples, uint8 pixels or floats in [0, 1]; y: its "
                    "labels) in --out, the block of the data set that the simulation of the same run "
                    "config deals agent p, so that a deployment trains on the simulation's data. Agent p's "
                    "SuperNode reads its own file (node config partition-id=<p> data-path=<file> "
                    "num-samples-total=<I>). Nothing is written unless a run could use the files.")
    parts.add_argument("--dataset", choices=IADMM_DATASETS, default=IADMM_DATASETS[0],
                       help=f"the data set (default: {IADMM_DATASETS[0]}, the embedded MNIST sample)")
    parts.add_argument("--data-dir", default="",
                       help="folder with the data set's files (default: the cache, fetched on first use)")
    parts.add_argument("--num-agents", type=int, default=0,
                       help="P, the number of agents (default: 0, the data set's count: 10 for default and "
                            "mnist, 195 for femnist)")
    parts.add_argument("--partition", default="contiguous",
                       help="how the samples are dealt, as the run's iadmm.partition: contiguous, "
                            "dirichlet:ALPHA, shards:K or quantity:ALPHA (default: contiguous)")
    parts.add_argument("--partition-seed", type=int, default=0,
                       help="the run's iadmm.partition-seed (default: 0)")
    parts.add_argument("--out", required=True, help="folder to write into (existing files are refused)")


def _add_node(commands: argparse._SubParsersAction) -> None:
    node = commands.add_parser(
        "node", help="a deployed device's own privacy: its policy and what it has spent",
        description="A deployed node keeps its secret, its policy (policy.toml) and its privacy budget "
                    "(agent-<id>.budget.jsonl) in its state folder: --state-dir, else $DPADMM_NODE_STATE, "
                    "else ~/.dpadmm/node. No run config reaches them.")
    steps = node.add_subparsers(dest="step", required=True)
    serve = steps.add_parser(
        "serve", help="answer a SuperNode's messages with the installed dpadmm (its isolated runtime)",
        description="Ask the SuperNode (started with --isolation process) for its ClientApp tasks and answer "
                    "each with the dpadmm installed here, in this one long-lived process; a run whose app is "
                    "not this installation is refused. `dpadmm deploy supernode` starts it beside the "
                    "SuperNode.")
    serve.add_argument("--runtime-api-address", default="127.0.0.1:9094",
                       help="the SuperNode's runtime API, HOST:PORT (its --port; default: 127.0.0.1:9094)")
    for name, text in (("status", "print the policy and, per agent and run, what the device has spent"),
                       ("policy", "print the policy in force, or --write the defaults to edit")):
        step = steps.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        step.add_argument("--state-dir", help="the node's state folder (default: $DPADMM_NODE_STATE, else "
                                              "~/.dpadmm/node)")
        if name == "policy":
            step.add_argument("--write", action="store_true",
                              help="write the default policy to <state-dir>/policy.toml (an existing one "
                                   "is refused)")


def _node(args: argparse.Namespace) -> int:
    from dpadmm.privacy import device

    if args.step == "serve":
        from dpadmm.deploy import RUNTIME_API_ADDRESS, check_address

        try:  # as `dpadmm deploy supernode` checks its SuperLink's: a bad one would be retried forever
            check_address(args.runtime_api_address, "runtime-api-address", RUNTIME_API_ADDRESS)
        except ValueError as err:
            print(f"dpadmm: error: {err}", file=sys.stderr)
            return 2
        from clients import runtime

        runtime.configure_logging()
        runtime.serve(runtime.Options(address=args.runtime_api_address))
        return 0
    directory = Path(args.state_dir) if args.state_dir else device.node_state_dir()
    try:
        if args.step == "status":
            print(device.status(directory))
        elif args.write:
            path = directory / device.POLICY_FILE
            if path.exists():
                raise ValueError(f"{path} exists; edit it, or remove it first")
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(path, device.Policy().to_toml())
            print(path)
        else:
            policy = device.read_policy(directory)
            unknown = sorted(set(policy.algorithms) - set(ALGORITHMS))
            if unknown:  # the device would refuse every run, each for an algorithm the policy does not name
                raise ValueError(f"{directory / device.POLICY_FILE}: algorithms names {unknown[0]!r}, which "
                                 f"no family runs; choose among {', '.join(ALGORITHMS)}")
            print(policy.to_toml(), end="")
    except (ValueError, OSError) as err:  # DeviceRefused is a ValueError: a damaged file, said as such
        print(f"dpadmm: error: {err}", file=sys.stderr)
        return 2
    return 0


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",")]


def _warned(build: Callable[[], _T]) -> _T:
    """Run ``build`` and show each warning it raised once, on stderr, as ``dpadmm: warning: ...``.

    The deploy helpers warn through :mod:`warnings` (right for library callers); a command line
    user should see the insecure-mode warning exactly once and in plain words, whatever the
    interpreter's warning filters say. Deprecations are left out: they are addressed to the developers of
    the code that raised them (typer's use of click, imported on the way), whom Python shows them to, and a
    user can do nothing about them.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = build()
    for warning in caught:
        if not issubclass(warning.category, DeprecationWarning | PendingDeprecationWarning):
            print(f"dpadmm: warning: {warning.message}", file=sys.stderr)
    return result


def _supernode(command: list[str], port: int) -> int:
    """Run ``command`` (flower-supernode with ``--isolation process``) and the device's runtime beside it, in
    this process (:func:`clients.runtime.serve`), until either ends: one process for a supervisor to keep
    (a systemd unit's ``ExecStart``). Ends with the SuperNode's exit code; SIGTERM ends both."""
    import subprocess

    sibling = Path(sys.executable).with_name(command[0])
    program = str(sibling) if os.access(sibling, os.X_OK) else shutil.which(command[0])
    if program is None:
        raise FileNotFoundError(f"{command[0]} not found next to {sys.executable} or on PATH; install flwr "
                                "(pip install 'flwr>=1.41,<1.42') or activate its environment")
    from clients import runtime

    runtime.configure_logging()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    node = subprocess.Popen([program, *command[1:]])  # its log lines go where this process's go

    def watch() -> None:
        node.wait()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        runtime.serve(runtime.Options(address=f"127.0.0.1:{port}"), stop)
    finally:
        if node.poll() is None:
            node.terminate()
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()
    return int(node.wait())


def _exec(command: list[str]) -> None:
    """Replace this process with ``command`` (same pid, so a supervisor's pid stays the server's).

    The program is looked up next to this interpreter first (the ``flwr`` that dpadmm was
    installed with), then on PATH.
    """
    sibling = Path(sys.executable).with_name(command[0])
    program = str(sibling) if os.access(sibling, os.X_OK) else shutil.which(command[0])
    if program is None:
        raise FileNotFoundError(f"{command[0]} not found next to {sys.executable} or on PATH; install flwr "
                                "(pip install 'flwr>=1.41,<1.42') or activate its environment")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(program, [command[0], *command[1:]])


def _append_connection(home: Path, name: str, block: str) -> Path:
    """Append ``block`` to ``home/config.toml``; refuse a name that is already there.

    The file is parsed before and after (the would-be text) so that dpadmm never leaves the
    user's Flower configuration unreadable.
    """
    path = home / "config.toml"
    if path.exists():
        text = path.read_text(encoding="utf-8")
        try:
            existing = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path} is not valid TOML ({err}); fix it before adding a connection") from err
        superlink = existing.get("superlink", {})
        if isinstance(superlink, dict) and name in superlink:
            raise FileExistsError(f"{path} already has a [superlink.{name}] connection; remove it or choose "
                                  "another --name")
        new_text = text + ("" if not text or text.endswith("\n") else "\n") + "\n" + block
    else:
        new_text = f'[superlink]\ndefault = "{name}"\n\n' + block
    try:
        tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"adding [superlink.{name}] would make {path} invalid TOML ({err}); "
                         "check its [superlink] table") from err
    home.mkdir(parents=True, exist_ok=True)
    write_atomic(path, new_text)
    return path


def _data(args: argparse.Namespace) -> int:
    """``dpadmm data fetch``: each data set's folder, its file count and its source and licence."""
    from dpadmm.data.download import data_mirrors, dataset_cache_dir, fetch, missing_files
    from dpadmm.data.sources import SOURCES

    names = list(SOURCES) if args.name == "all" else [args.name]
    if args.dir and len(names) > 1:
        print("dpadmm: error: --dir is not allowed with all: it is one data set's folder", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        source = SOURCES[name]
        manual = not any(f.urls for f in source.files) and data_mirrors() is None
        if args.name == "all" and manual and missing_files(name, dataset_cache_dir(name)):
            print(f"{name}: not fetched: {source.by_hand}; put it into {dataset_cache_dir(name)}, or give "
                  "its folder as --data-dir", file=sys.stderr)
            continue
        try:
            folder = fetch(name, args.dir, progress=not args.no_progress)
        except (ValueError, OSError) as err:  # OSError: DownloadError, or a folder that cannot be written
            print(f"dpadmm: error: {err}", file=sys.stderr)
            failed += 1
            continue
        files = f"{len(source.files)} file{'s' if len(source.files) > 1 else ''}"
        print(f"{name}: {folder} ({files}) - {source.title}; licence: {source.licence}; source: "
              f"{source.homepage}")
    return 2 if failed else 0


def _deploy(args: argparse.Namespace) -> int:
    from dpadmm import deploy

    try:
        if args.step == "certs":
            paths = deploy.make_certificates(args.out, _split(args.hosts), days=args.days)
            for path in (paths.ca_cert, paths.server_cert, paths.server_key):
                print(path)
            print(f"copy {paths.ca_cert} to every device (SuperNodes and the machine running `flwr`); "
                  f"{paths.server_key} stays on the SuperLink only")
        elif args.step == "keys":
            for key in deploy.make_node_keys(args.out, _split(args.names)):
                pub = key.with_name(key.name + ".pub")
                print(pub)
                print(f"  register: flwr supernode register {shlex.quote(str(pub))} <connection-name>")
            print("copy each private key to its device only; <connection-name> is the --name of "
                  "`dpadmm deploy connection`")
        elif args.step == "superlink":
            command = _warned(lambda: deploy.superlink_command(
                None if args.certs is None else Path(args.certs), host=args.host, port=args.port,
                database=args.database, insecure=args.insecure))
            if args.print:
                print(shlex.join(command))
            else:
                _exec(command)
        elif args.step == "supernode":
            missing = [flag for flag, value in (("--ca-cert", args.ca_cert), ("--key", args.key))
                       if value is None]
            if missing and not args.insecure:
                raise ValueError(f"{' and '.join(missing)} missing: a secure SuperNode needs the CA "
                                 "certificate (ca.crt) and its registered private key (or --insecure, "
                                 "explicitly)")
            command = _warned(lambda: deploy.supernode_command(
                args.superlink, args.node_config, ca_cert=args.ca_cert, private_key=args.key, port=args.port,
                insecure=args.insecure))
            runtime = deploy.runtime_command(args.port)
            if args.print:
                print(shlex.join(command))
                print(shlex.join(runtime))
            else:
                return _supernode(command, args.port)
        elif args.step == "connection":
            block = _warned(lambda: deploy.connection_toml(args.name, args.address, args.ca_cert,
                                                           insecure=args.insecure))
            if args.print:
                print(block, end="")
            else:
                home = Path(args.flwr_home or os.environ.get("FLWR_HOME") or Path.home() / ".flwr")
                path = _append_connection(home, args.name, block)
                print(f"{path}: added [superlink.{args.name}]; run `flwr run . {args.name}`")
        elif args.step == "vertical":
            *parties, labels = deploy.vertical_files(args.dataset, args.data_dir, args.parties, args.out)
            for m, path in enumerate(parties):
                print(path)
                print(f"  party {m}'s device only: --node-config \"partition-id={m} "
                      f"data-path='{path.resolve()}'\"")
            print(labels)
            print(f"  the server only: --run-config \"algorithm='admm-sharing' "
                  f"sharing.dataset='{args.dataset}' sharing.parties='{args.parties}' "
                  f"sharing.labels-path='{labels.resolve()}'\"")
        elif args.step == "agents":
            paths = deploy.agent_files(args.data_dir, args.agents, args.samples, args.seed, args.out,
                                       args.partition)
            for i, path in enumerate(paths):
                print(path)
                print(f"  agent {i}'s device only: --node-config \"partition-id={i} "
                      f"data-path='{path.resolve()}'\"")
            print(f"the server holds no data: --run-config \"algorithm='ldp-admm' "
                  f"decentral.agents={args.agents} decentral.samples={args.samples} "
                  f"decentral.seed={args.seed}\" with the graph's keys (decentral.graph, decentral.edges)")
        elif args.step == "partitions":
            paths, total = deploy.partition_files(args.dataset, args.data_dir, args.num_agents, args.out,
                                                  args.partition, args.partition_seed)
            for p, path in enumerate(paths):
                print(path)
                print(f"  agent {p}'s device only: --node-config \"partition-id={p} "
                      f"data-path='{path.resolve()}' num-samples-total={total}\"")
            print(f"the server: --run-config \"iadmm.dataset='{args.dataset}' iadmm.num-agents={len(paths)} "
                  f"iadmm.partition='{args.partition}' iadmm.partition-seed={args.partition_seed}\" (it "
                  "evaluates on the data set's test samples)")
    except (ValueError, OSError) as err:  # OSError: existing, missing or unwritable files
        print(f"dpadmm: error: {err}", file=sys.stderr)
        return 2
    return 0


def _negative_values_attached(argv: list[str]) -> list[str]:
    """``--flag -1,124`` as ``--flag=-1,124``: argparse takes a value that starts with '-' and is not a plain
    number for another flag and answers "expected one argument"; attached, the value reaches the check
    that names it and what is allowed."""
    out: list[str] = []
    for word in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"-[\d.]", word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def _answers_and_ends(args: argparse.Namespace) -> bool:
    """Whether the command prints its answer and ends: not a run (train, reproduce) nor a process that
    serves (``node serve``, ``deploy superlink`` and ``supernode`` unless they only ``--print``)."""
    if args.command in ("train", "reproduce"):
        return False
    step = getattr(args, "step", None)
    if args.command == "node" and step == "serve":
        return False
    return not (args.command == "deploy" and step in ("superlink", "supernode") and not args.print)


def main(argv: Sequence[str] | None = None) -> int:
    argv_given = argv
    argv = _negative_values_attached(sys.argv[1:] if argv is None else list(argv))
    family = _family_in(argv)
    parser = build_parser(family, _paper_in(argv))
    args = parser.parse_args(argv)
    if getattr(args, "device", None) == "cuda" and args.command in ("train", "audit", "reproduce"):
        import torch

        if not torch.cuda.is_available():  # else every round (or every cell) fails with torch's traceback
            why = "has no CUDA" if torch.version.cuda is None else "sees no GPU"
            parser.error(f"device='cuda' is not available here (torch {torch.__version__} {why}); use "
                         "--device cpu")
    if argv_given is None and _answers_and_ends(args):
        # `dpadmm node status | head -3`: the reader has what it wanted; end quietly, as `ls | head` does,
        # not with "[Errno 32] Broken pipe". Runs and servers keep Python's default (an error they handle).
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if argv_given is None and args.command in ("train", "reproduce"):
        keep_freed_memory()  # the dpadmm command's own process runs engines; a caller's is left as it is
        # SIGTERM (a scheduler, `kill`, systemd) ends the run as Ctrl-C does: its folder marked failed with
        # what it spent, and resumable, instead of a process killed between two files.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.command == "reproduce":
        status = _reproduce(args)
        if status == 130 and argv_given is None:
            # An interrupted cell leaves torch's native threads mid-work; the interpreter's own exit then
            # aborts ("terminate called without an active exception", status 134). Everything is written
            # (the cells' checkpoints, pending-cells.json, the report's banner): end the process here.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return status
    if args.command == "deploy":
        return _deploy(args)
    if args.command == "data":
        return _data(args)
    if args.command == "node":
        return _node(args)
    try:
        family_of(args.algorithm or DEFAULT.config().algorithm)  # an unknown one: the error names all
        config = _config_from(args, family)
    except ValueError as err:
        parser.error(str(err))
    if args.command == "audit":
        return _audit(args, config, family)
    if family is not DEFAULT:
        return _family_command(args, config, family)
    if args.command == "privacy":
        from dpadmm.data import train_size
        from dpadmm.iadmm import privacy  # and no torch: the ledger needs the sample count, not the data

        try:
            total = train_size(config.dataset, config.data_dir, config.num_agents)
            ledger = privacy.ledger(privacy.calibrate(config), total_samples=total)
        except (ValueError, OSError) as err:  # OSError: missing or unreadable files
            print(f"dpadmm: error: {err}", file=sys.stderr)
            return 2
        print(json.dumps(ledger.to_dict(), default=str) if args.json else ledger.summary())
        return 0
    if args.command == "train":
        engine = _engine("iadmm")

        if not (args.checkpoint_minutes >= 0 and math.isfinite(args.checkpoint_minutes)):
            parser.error(f"--checkpoint-minutes {args.checkpoint_minutes!r} is not allowed; it must be >= 0 "
                         "(0 = no checkpoints)")
        folder, resuming = _train_folder(config)
        # weights.npz holds every round's model and is written when a run ends: such a run cannot resume
        saving = args.checkpoint_minutes > 0 and not config.save_weights
        if resuming:
            print(f"dpadmm: resuming the interrupted run in {folder} from its checkpoint", file=sys.stderr)
        try:
            saved_state = (folder / CHECKPOINT) if saving else None
            result = engine.run_seeds(config, [config.seed], progress=not args.no_progress,
                                      directories=[folder], checkpoint=saved_state,
                                      checkpoint_seconds=60 * args.checkpoint_minutes)[0]
        except (ValueError, OSError) as err:  # OSError: missing or unreadable files
            print(f"dpadmm: error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (main makes it the same): no traceback
            print(_interrupted(folder, saving), file=sys.stderr)
            return 130
        (folder / CHECKPOINT).unlink(missing_ok=True)  # the run is complete: its state is in its files
        from dpadmm.iadmm.privacy import headline, step_line

        last = result.records[-1]
        print(
            f"{config.algorithm} ({step_line(result.config)}, E={config.steps}, "
            f"P={config.num_agents}, T={config.rounds}): round {last['round']} test error "
            f"{last['test-error']:.4f}, train loss {last['train-loss']:.4f}, "
            f"consensus violation {last['consensus-violation']:.4g}"
        )
        print(result.ledger.summary() if result.ledger else "privacy: none (non-private run, no noise)")
        print(f"metrics: {(result.directory / 'metrics.jsonl').resolve()}")
        if result.ledger:
            print(headline(result.ledger, last["test-error"]))
    return 0


# The state of an interrupted `dpadmm train`, in its run folder (removed when the run completes).
CHECKPOINT = "checkpoint.pt"


def _train_folder(config: Any) -> tuple[Path, bool]:
    """(the folder `dpadmm train` writes, whether it resumes the run there).

    The run's folder (``out``, or the default named after its privacy) when it holds an interrupted run
    with a checkpoint: the same command resumes it (a checkpoint of another configuration is refused by
    the engine, naming what differs). Otherwise a fresh folder, never overwriting a run."""
    from dpadmm.files import fresh_path
    from dpadmm.runs.results import failure

    base = Path(config.out or config.default_out())
    if failure(base) is not None and (base / CHECKPOINT).exists() and not config.save_weights:
        return base, True
    return fresh_path(base), False


def _interrupted(folder: Path, saving: bool | None) -> str:
    """What an interrupted `dpadmm train` says: which rounds its folder holds, what its privacy.json states,
    and how to go on. ``saving`` None: a family whose engine keeps no checkpoint. No import of torch unless a
    checkpoint is read: an interrupt during torch's own import leaves it half-imported."""
    from dpadmm.runs.results import failure

    if failure(folder) is None:  # before the run's folder was written (loading the data, calibrating)
        return "dpadmm: interrupted before the run started; nothing was written"
    done = failure(folder)["completed-rounds"]
    said = f"dpadmm: interrupted after {done} completed round(s); {folder} is marked failed (failed.json)"
    if (folder / "privacy.json").exists():  # a private run's, rewritten with what was spent
        said += " and its privacy.json states what those rounds spent"
    if saving is None:
        return (f"{said}. This family's engine keeps no checkpoint: the same command starts a new run from "
                "round 1")
    path = folder / CHECKPOINT
    if saving and path.exists():  # mmap: the round without reading the whole state
        from dpadmm.runs import checkpoint

        saved = checkpoint.read(path, mmap=True)["round"]
        return f"{said}. Run the same command again to resume from round {saved + 1} (its checkpoint)"
    when = ("the first comes after --checkpoint-minutes" if saving
            else "--checkpoint-minutes is 0, or --save-weights, whose file is written when a run ends")
    return f"{said}. No checkpoint was saved ({when}): the same command starts a new run from round 1"


# A run's keys that `dpadmm audit` reads in no family: its data, its outputs, Flower's waiting times.
AUDIT_UNREAD = ("data_dir", "labels_path", "out", "save_weights", "eval_every", "node_timeout",
                "round_timeout")

# The most releases per neighbour `dpadmm audit` observes: they are held in memory (up to 2 x 16 floats each),
# so 10**7 take a few GB; the default 200,000 already bounds epsilon within a few hundredths.
MAX_TRIALS = 10_000_000


def _audit(args: argparse.Namespace, config: Any, family: Family) -> int:
    """``dpadmm audit``: each family's attacks (``dpadmm.<family>.audit.audits``), one line or one JSON object
    per release kind."""
    if not 100 <= args.trials <= MAX_TRIALS:
        print(f"dpadmm: error: --trials {args.trials} is not allowed; it must be in 100..{MAX_TRIALS:,} "
              "(each trial keeps its releases in memory, a few hundred bytes)", file=sys.stderr)
        return 2
    if not 0 < args.alpha < 1:
        print(f"dpadmm: error: --alpha {args.alpha!r} is not allowed; it must be in (0, 1)", file=sys.stderr)
        return 2
    try:
        # the run's data and outputs: given here they would be silently ignored
        keys.require_default(config, "by dpadmm audit, which attacks the mechanism on neighbouring data sets "
                             "of its own and writes nothing (--json prints its results)", *AUDIT_UNREAD)
        audit = importlib.import_module(f"dpadmm.{family.name}.audit")
        results = audit.audits(config, trials=args.trials, alpha=args.alpha)
    except (ValueError, OSError) as err:  # OSError: missing or unreadable files
        print(f"dpadmm: error: {err}", file=sys.stderr)
        return 2
    for result in results:
        print(json.dumps(result.to_dict(), default=str) if args.json else result.line())
        if not args.json:
            print(f"  attack: {result.attack}; {result.detail}")
    return 0


def _family_command(args: argparse.Namespace, config: Any, family: Family) -> int:
    """``train`` and ``privacy`` for a family with ``privacy.stated`` (its ledger from the configuration
    alone) and ``engine.run`` / ``engine.summary`` (its run and the line that reports it): 002 and 001."""
    from dpadmm.files import fresh_path

    folder = fresh_path(config.out or config.default_out())  # made only once the run starts
    try:
        privacy = importlib.import_module(f"dpadmm.{family.name}.privacy")
        if args.command == "privacy":
            ledger = privacy.stated(config)
            print(json.dumps(ledger.to_dict(), default=str) if args.json else ledger.summary())
            return 0
        engine = _engine(family.name)
        result = engine.run(config, directories=[folder], progress=not args.no_progress)
    except (ValueError, OSError) as err:  # OSError: missing or unreadable files
        print(f"dpadmm: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (main makes it the same): no traceback
        print(_interrupted(folder, None), file=sys.stderr)
        return 130
    print(engine.summary(config, result.records[0][-1]))
    print(result.ledger.summary() if result.ledger else "privacy: none (non-private run, no noise)")
    print(f"metrics: {(result.directories[0] / 'metrics.jsonl').resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
