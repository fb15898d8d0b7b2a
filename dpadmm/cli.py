"""The ``dpadmm`` command line: ``dpadmm train`` runs the batched engine, ``dpadmm privacy``
prints a configuration's privacy ledger, ``dpadmm reproduce`` reruns the papers' grid.

Its flags are the run-config keys of the Flower app (``--local-steps`` is
``local-steps``), generated from ``RunConfig`` so the two cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from dpadmm.config import RunConfig


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata.get('help', '')} (default: {f.default!r})"
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=f.default, help=help_text)
        else:
            type_name = f.type if isinstance(f.type, str) else f.type.__name__
            kind = {"int": int, "float": float}.get(type_name, str)
            parser.add_argument(flag, type=kind, default=f.default, help=help_text,
                                metavar=f.name.upper())


def _config_from(args: argparse.Namespace) -> RunConfig:
    return RunConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig)})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpadmm",
        description="Differentially private federated learning via inexact ADMM (Ryu & Kim).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train",
        help="run an algorithm with every agent batched on one device",
        description="Run DP-IADMM (or the OutP baseline) with every agent batched on one device; "
                    "writes <out>/config.json and <out>/metrics.jsonl.",
    )
    _add_config_flags(train)
    train.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    ledger = commands.add_parser(
        "privacy",
        help="print the privacy ledger of a configuration without training",
        description="Print what a configuration guarantees per local step, per round and for the whole "
                    "run (PLD, RDP, basic and advanced composition), without training.",
    )
    _add_config_flags(ledger)
    ledger.add_argument("--json", action="store_true", help="print the ledger as one JSON object")
    _add_reproduce(commands)
    return parser


def _add_reproduce(commands: argparse._SubParsersAction) -> None:
    from dpadmm.reproduce import GridConfig

    d = GridConfig()
    rep = commands.add_parser(
        "reproduce",
        help="rerun the papers' experiments and report them next to the papers' numbers",
        description="Run Ryu & Kim's grid (algorithms x eps-bar x data sets x seeds) with the papers' "
                    "data-dependent sensitivity, resuming where an earlier call stopped, and write "
                    "results.csv, summary.md and the figures into --out.",
    )
    rep.add_argument("--out", default=d.out, help=f"output folder (default: {d.out})")
    rep.add_argument("--datasets", default=",".join(d.datasets), help="comma-separated: mnist,femnist")
    rep.add_argument("--algorithms", default=",".join(d.algorithms),
                     help=f"comma-separated (default: {','.join(d.algorithms)})")
    rep.add_argument("--eps", default=",".join(f"{e:g}" for e in d.eps),
                     help="comma-separated eps-bar values of the private algorithms "
                          f"(default: {','.join(f'{e:g}' for e in d.eps)})")
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
    rep.add_argument("--report-only", action="store_true",
                     help="only rebuild the report from the completed cells")
    rep.add_argument("--no-progress", action="store_true", help="do not show progress bars")


def _reproduce(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dpadmm import reproduce

    try:
        if args.report_only:
            out = Path(args.out)
            if not (out / "runs").is_dir():
                raise FileNotFoundError(f"{out} holds no reproduce runs (no runs/ folder)")
            reproduce.write_report(out, args.delta)
        else:
            grid = reproduce.grid_from_args(**{k: v for k, v in vars(args).items()
                                               if k not in ("command", "report_only", "no_progress")})
            out = reproduce.run_grid(grid, progress=not args.no_progress)
    except (ValueError, OSError) as err:  # OSError: missing or unreadable files
        print(f"dpadmm: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {(out / 'summary.md').resolve()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "reproduce":
        return _reproduce(args)
    try:
        config = _config_from(args)
    except ValueError as err:
        parser.error(str(err))
    if args.command == "privacy":
        from dpadmm import privacy

        try:
            from dpadmm.federation import load_for

            ledger = privacy.ledger(privacy.calibrate(config), total_samples=load_for(config).num_train)
        except (ValueError, OSError) as err:  # OSError: missing or unreadable files
            print(f"dpadmm: error: {err}", file=sys.stderr)
            return 2
        print(json.dumps(ledger.to_dict(), default=str) if args.json else ledger.summary())
        return 0
    if args.command == "train":
        from dpadmm import engine

        try:
            result = engine.run(config, progress=not args.no_progress)
        except (ValueError, OSError) as err:  # OSError: missing or unreadable files
            print(f"dpadmm: error: {err}", file=sys.stderr)
            return 2
        last = result.records[-1]
        print(
            f"{config.algorithm} (eps-bar={result.config.effective_epsilon:.4g} per local step, "
            f"E={config.steps}, "
            f"P={config.num_agents}, T={config.rounds}): round {last['round']} test error "
            f"{last['test-error']:.4f}, train loss {last['train-loss']:.4f}, "
            f"consensus violation {last['consensus-violation']:.4g}"
        )
        print(result.ledger.summary() if result.ledger else "privacy: none (non-private run, no noise)")
        print(f"metrics: {(result.directory / 'metrics.jsonl').resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
