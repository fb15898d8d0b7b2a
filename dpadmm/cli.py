"""The ``dpadmm`` command line: ``dpadmm train`` runs the batched engine, ``dpadmm privacy``
prints a configuration's privacy ledger.

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = _config_from(args)
    except ValueError as err:
        parser.error(str(err))
    if args.command == "privacy":
        from dpadmm import privacy

        try:
            from dpadmm.federation import load_for

            ledger = privacy.ledger(privacy.calibrate(config), total_samples=load_for(config).num_train)
        except (ValueError, FileNotFoundError) as err:
            print(f"dpadmm: error: {err}", file=sys.stderr)
            return 2
        print(json.dumps(ledger.to_dict(), default=str) if args.json else ledger.summary())
        return 0
    if args.command == "train":
        from dpadmm import engine

        try:
            result = engine.run(config, progress=not args.no_progress)
        except (ValueError, FileNotFoundError) as err:
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
