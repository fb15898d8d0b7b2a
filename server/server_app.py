"""The ServerApp of every family: run config -> the family's strategy -> central evaluation -> results.

``algorithm`` picks the family (:mod:`dpadmm.families`), and each family reads its own table of the
run config (``iadmm.<key>`` for DP-IADMM's main preset, ``linadmm.<key>`` for DP-ADMM / DP-AccADMM,
paper 002); a value given in a table the run does not read is refused.

Writes the same ``config.json`` / ``privacy.json`` / ``metrics.jsonl`` (and ``weights.npz``
with ``save-weights``) as ``dpadmm train``, plus ``rounds.jsonl`` (the operator's report of
every round: who was sampled, who replied, who was rejected and why, privacy spent) and
``checkpoint.pt``, the strategy's state after the last completed round. Submitting the
same run again with ``out`` naming that folder resumes it from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from logging import DEBUG, ERROR, INFO
from pathlib import Path
from typing import Any, NoReturn

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.server import LegacyContext, ServerConfig
from flwr.serverapp import Grid, ServerApp

import dpadmm
from dpadmm.data.vertical import read_labels_file, require_widths, row_digest
from dpadmm.decentral import engine as decentral_engine
from dpadmm.decentral import privacy as decentral_privacy
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.privacy import Statement
from dpadmm.decentral.problem import FEATURES, public_agents
from dpadmm.decentral.problem import Problem as DecentralProblem
from dpadmm.decentral.problem import build as decentral_problem
from dpadmm.families import from_run_config
from dpadmm.iadmm import privacy
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.federation import DTYPES, load_for
from dpadmm.linadmm import engine as linadmm_engine
from dpadmm.linadmm import privacy as linadmm_privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.linadmm.problem import load
from dpadmm.models.modules import build_model, initial_parameters
from dpadmm.privacy.ledger import Ledger
from dpadmm.privacy.randomness import DEPLOYMENT, SIMULATION, statement
from dpadmm.runs.results import RunWriter, central_metrics, closing
from dpadmm.sharing import engine as sharing_engine
from dpadmm.sharing import privacy as sharing_privacy
from dpadmm.sharing.config import SharingConfig
from strategies import DPIADMM
from strategies.decentral import GraphRouter, SecureSum, secure_workflow
from strategies.linadmm import DPLinADMM, server_secret
from strategies.nodes import RunRefused, refuse_run, server_kind
from strategies.sharing import ADMMSharing

CHECKPOINT = "checkpoint.pt"

app = ServerApp()


class RunConfigError(ValueError):
    """A run config key whose value is not allowed. The ServerApp has logged the key, the value and what
    is allowed on one line; raising ends the run as failed, Flower's way for an app: the run's status
    becomes ``finished:failed`` with this message as its details (``flwr ls``), and Flower logs its exit
    code (700 in a simulation, 201 under a SuperLink). ``flwr run --stream`` itself exits 0 whatever the
    run's outcome (flwr 1.41's CLI ends when the log stream ends)."""


def refuse(reason: str) -> NoReturn:
    """Log ``reason`` on one line and end the run as failed (:class:`RunConfigError`), before it starts."""
    log(ERROR, "dpadmm: the run config is not allowed: %s", reason)
    raise RunConfigError(reason)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Refusals end the run with one line and a short traceback (raised from None), not the checks' frames:
    a key refused here, a node that refuses its configuration or data, or a federation that does not match
    (:class:`strategies.nodes.RunRefused`, logged where it is found), or the server's own data files (a
    ``ValueError`` or ``OSError``, named with the file by the loaders; the frames go to the debug log)."""
    try:
        config = configured(context.run_config)
    except ValueError as error:
        refuse(str(error))
    log(INFO, "%s", where(config))
    # Ctrl-C on `flwr run --stream` ends only the log stream: the run goes on in the SuperLink
    log(INFO, "dpadmm: this is run %s; `flwr stop %s` stops it (Ctrl-C on `flwr run --stream` only stops "
        "showing its log)", context.run_id, context.run_id)
    try:
        if isinstance(config, DecentralConfig):
            decentral_main(grid, context, config)
        elif isinstance(config, SharingConfig):
            sharing_main(grid, config)
        elif isinstance(config, LinAdmmConfig):
            linadmm_main(grid, config)
        else:
            iadmm_main(grid, config)
    except (RunConfigError, RunRefused) as error:
        raise type(error)(str(error)) from None
    except (ValueError, OSError) as error:
        log(DEBUG, "dpadmm: %s", "".join(traceback.format_exception(error)))
        try:
            refuse_run(str(error))
        except RunRefused as refused:
            raise refused from None


def where(config: Any) -> str:
    """The ServerApp's first line: the folder its code runs from (where the SuperLink unpacked the app), the
    Python that runs it, where ``dpadmm`` comes from, the working folder and the run folder it writes.

    ``flwr run .`` reuses any SuperLink that already listens on Flower's fixed local address (another
    checkout's, another project's) and then runs the app in that SuperLink's environment and working
    folder: the packages are that environment's, and a relative ``out`` (the default ``runs/...``) lands
    in that folder. This line makes such a reuse visible at once (docs: getting-started)."""
    app_folder = Path(__file__).resolve().parent.parent
    package = Path(dpadmm.__file__).resolve().parent
    target = Path(config.out or config.default_out()).resolve()
    if isinstance(config, RunConfig) and config.out and (target / CHECKPOINT).exists():
        writes = f"this run resumes {target}"
    else:
        writes = f"this run writes {target} (or {target.name}_<n> beside it if that folder holds a run)"
    return (f"dpadmm ServerApp: app folder {app_folder}, Python {sys.executable}, dpadmm package {package}, "
            f"working folder {Path.cwd()}; {writes}")


def configured(run_config: Mapping[str, Any]) -> Any:
    """The family's configuration of ``run_config``, checked (DP-IADMM's also calibrated, which refuses
    budgets it cannot meet): every ``ValueError`` here is the user's key, not a fault of the run."""
    config = from_run_config(run_config)
    return privacy.calibrate(config) if isinstance(config, RunConfig) else config


@contextmanager
def run_folder(config: Any, ledger: Ledger | Statement | None,
               kinds: Callable[[], Iterable[str]] | None = None, *,
               released: Callable[[], int] = lambda: 0,
               spent: Callable[[int], Ledger | Statement] | None = None,
               run_identity: str = "") -> Iterator[RunWriter]:
    """A fresh run folder of ``config`` (config.json, with the ``run_identity`` sent to the nodes:
    :func:`opened`; privacy.json for a private run), open while the strategy
    runs and closed whatever happens: when the strategy raises, the folder is marked failed (failed.json)
    and privacy.json states ``spent(released())``, what the rounds with releases spent (a round in flight
    counts: its nodes may have released), not the planned run. At the end, ``kinds`` (the kinds of
    randomness the nodes reported, :mod:`clients.randomness`) goes into the statement, privacy.json is
    written again with it, and the statement's summary is logged."""
    writer = RunWriter(config.to_mapping(), engine="flower", directory=config.out or config.default_out(),
                       fresh=True, run_identity=run_identity)
    opened(writer, "writing", run_identity)
    if ledger:
        writer.write_ledger(ledger)
        writer.spent = spent
    with closing([writer]):
        try:
            yield writer
        finally:  # before closing() marks a failed folder
            writer.completed = released()
    if ledger and kinds is not None:
        ledger = dataclasses.replace(ledger, randomness=statement(set(kinds())))
        writer.write_ledger(ledger)
    log(INFO, "dpadmm: %s", ledger.summary() if ledger else "privacy: none (non-private run, no noise)")


def opened(writer: RunWriter, doing: str, run_identity: str) -> None:
    """Log the run folder's metrics file and the run's identity: the name each deployed device's ``dpadmm
    node status`` gives the run, which config.json records as ``run-identity``."""
    log(INFO, "dpadmm: %s %s (run identity %s, as `dpadmm node status` names the run on each device)", doing,
        Path(writer.directory).resolve() / "metrics.jsonl", run_identity)


def metric_record(record: Mapping[str, Any]) -> MetricRecord:
    """A round's record as the ServerApp-side evaluation the strategy's result keeps: its numbers, which
    Flower's closing summary ("ServerApp-side Evaluate Metrics") prints per round."""
    return MetricRecord({k: v for k, v in record.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)})


def decentral_main(grid: Grid, context: Context, config: DecentralConfig) -> None:
    """Paper 004: the ServerApp only routes the exchanged iterates along the graph (no server in the
    algorithm), or with ``exchange=secret`` sums them by SecAgg+ (:func:`decentral_secure`).

    In a simulation (Flower's in-memory grid), or with ``data-dir``, it also reads the data set (from the
    cache when no folder is given, as the simulated agents do), to evaluate the distance to x*; a
    deployment without it (whose agents read their own files) holds no data and reports what the
    exchanged iterates show: the consensus (and the a-priori epsilon). Once an agent reports deployment
    randomness, the router reports only those public metrics even with ``data-dir``: the distance to x*
    reads every agent's raw data, a simulation's diagnostic that no guarantee covers.

    The privacy statement (privacy.json, the closing line) says which randomness the agents reported
    (:func:`dpadmm.privacy.randomness.statement`); privacy.json is written when the run starts and again,
    with the kinds, when it ends."""
    dtype = decentral_engine.DTYPES[config.dtype]
    problem = (decentral_problem(config, decentral_engine.dataset_of(config), [config.seed], dtype)
               if config.data_dir or server_kind(grid) == SIMULATION else None)
    agents = problem.agents if problem else public_agents(config, dtype)
    stated = decentral_privacy.statement(config, FEATURES[config.dataset]) if config.private else None
    # first: the strategy refuses what it cannot run, and the nodes what they cannot, before a folder is made
    strategy = SecureSum(config, agents) if config.exchange == "secret" else GraphRouter(config, agents)
    strategy.roster.admit(grid)
    with run_folder(config, stated, lambda: strategy.kinds.values(), released=lambda: strategy.sent,
                    spent=lambda k: decentral_privacy.spent(config, FEATURES[config.dataset], k),
                    run_identity=strategy.run_identity) as writer:
        if isinstance(strategy, SecureSum):
            decentral_secure(grid, context, config, strategy, problem, writer)
        else:
            router = strategy

            def evaluate(k: int, state: decentral_engine.State) -> MetricRecord | None:
                if k % config.eval_every and k != config.rounds:
                    return None
                simulated = problem is not None and DEPLOYMENT not in router.kinds.values()
                record = (decentral_engine.evaluate(config, problem, state, k) if simulated else
                          decentral_engine.public_metrics(config, agents.adjacency, state.x, k))[0]
                writer.record({**record, "seconds": router.seconds, "elapsed": router.elapsed})
                error = (f"log-error {record['log-error']:.4f} (worst agent {record['log-error-max']:.4f}), "
                         if simulated else "")
                log(INFO, "dpadmm iteration %d/%d: %sconsensus %.4g", k, config.rounds, error,
                    record["consensus"])
                return metric_record(record)

            router.start(grid=grid, evaluate_fn=evaluate)


def decentral_secure(grid: Grid, context: Context, config: DecentralConfig, strategy: SecureSum,
                     problem: DecentralProblem | None, writer: RunWriter) -> None:
    """Algorithm 1's SecAgg+ form: the server holds only S^k, the sum of the agents' iterates, so it reports
    the log-error of their average (``log-error-average``, when it holds the data set and no agent reported
    deployment randomness) and the a-priori epsilon, into ``writer``; ``strategy.kinds`` then says the
    agents' randomness."""
    n = strategy.n

    def evaluate(k: int, total: torch.Tensor) -> dict[str, float] | None:
        if k % config.eval_every and k != config.rounds:
            return None
        record: dict[str, float] = {"round": k}
        if problem and DEPLOYMENT not in strategy.kinds.values():
            average = (total / n).to(problem.optimum).unsqueeze(0)  # [1, d]
            record["log-error-average"] = float(decentral_engine.log_error(problem.optimum, average)[0])
            log(INFO, "dpadmm iteration %d/%d: log-error of the agents' average %.4f (SecAgg+: the server "
                "holds only their sum)", k, config.rounds, record["log-error-average"])
        else:
            log(INFO, "dpadmm iteration %d/%d: summed by SecAgg+", k, config.rounds)
        if config.private:
            record["epsilon"] = decentral_privacy.loss_through(config, FEATURES[config.dataset], k)
        record = {**record, "seconds": strategy.seconds, "elapsed": strategy.elapsed}
        writer.record(record)
        return record

    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=config.rounds), strategy=strategy)
    strategy.evaluate_fn = evaluate
    secure_workflow(config, n)(grid, legacy)


def linadmm_main(grid: Grid, config: LinAdmmConfig) -> None:
    """DP-ADMM / DP-AccADMM (002): the server holds A and the test set, and adds the noise (central DP).

    Its randomness is the server's own (:func:`strategies.nodes.server_kind`): simulation on Flower's
    in-memory grid (``flwr run`` on the simulation engine, ``run_simulation``), keyed by the seed as the
    engine's; deployment elsewhere, from the server's own secret (:func:`strategies.linadmm.server_secret`)
    bound to a run identity drawn for this run, the noise on a grid. ``$DPADMM_RANDOMNESS`` in the server's
    environment may force either. A deployed server reports no training objective (it reads the raw
    training rows, which no guarantee covers), only the test accuracy and the primal residual."""
    problem = load(config.dataset, config.data_dir, config.graph_alpha, linadmm_engine.DTYPES[config.dtype])
    kind = server_kind(grid)
    secret = server_secret() if kind == DEPLOYMENT and config.private else None
    # first: it refuses what it cannot run, before the secret is read
    strategy = DPLinADMM(config, problem.a, problem.num_samples, secret)
    ledger = linadmm_privacy.ledger(config, problem.num_samples) if config.private else None
    if ledger:
        ledger = dataclasses.replace(ledger, randomness=statement([kind]))
    strategy.roster.admit(grid)  # the nodes refuse what they cannot run, before a run folder is made
    train = kind != DEPLOYMENT
    clock = {"elapsed": 0.0}  # the seconds of iterations 1..t, as the engine's ``elapsed``

    def evaluate(writer: RunWriter, t: int, state: linadmm_engine.State, y: torch.Tensor
                 ) -> MetricRecord | None:
        clock["elapsed"] += strategy.seconds
        if t % config.eval_every and t != config.rounds:
            return None
        record = {**linadmm_engine.evaluate(problem, state, y, t, config.l1, train=train)[0],
                  "seconds": strategy.seconds, "elapsed": clock["elapsed"]}
        first = writer.last_round is None  # the first evaluated round says what the accuracy must beat
        writer.record(record)
        objective = f"objective {record['objective']:.6g}, " if train else ""
        majority = f" ({linadmm_engine.majority_note(record)})" if first else ""
        log(INFO, "dpadmm round %d/%d: %stest accuracy %.4f%s, primal residual %.4g", t, config.rounds,
            objective, record["test-accuracy"], majority, record["primal-residual"])
        return metric_record(record)

    # the server releases (its noise) in each round's aggregation, which sets strategy.round
    with run_folder(config, ledger, released=lambda: strategy.round,
                    spent=lambda t: linadmm_privacy.ledger(config, problem.num_samples, t),
                    run_identity=strategy.run_identity) as writer:
        strategy.start(grid=grid, evaluate_fn=lambda t, state, y: evaluate(writer, t, state, y))


def sharing_main(grid: Grid, config: SharingConfig) -> None:
    """ADMM sharing (001): the server holds the labels, z and y; each party (a SuperNode) its columns.

    The labels come from ``labels-path`` in a deployment (the server holds no features), else from the
    configured data set, whose ids are its row numbers; every party's ids must match them.

    Each party draws its own noise (:mod:`clients.randomness`); the server sends the run identity and states
    the kinds the parties reported. ``noise = paper`` has no grid sampler, so deployed parties refuse it;
    outside Flower's simulation engine the server refuses it first, on one line, unless its environment
    forces the simulation kind (:func:`strategies.nodes.server_kind`)."""
    if config.private and config.noise == "paper" and server_kind(grid) == DEPLOYMENT:
        refuse(sharing_engine.PAPER_REFUSED)
    if config.labels_path:
        held = read_labels_file(config.labels_path)
        y_train, y_test, digest = held.y, held.y_test, held.digest()
    else:
        dataset = sharing_engine.dataset_of(config)  # the server uses the labels, and checks the widths
        try:
            require_widths(config.widths, dataset.num_features)
        except ValueError as error:
            refuse(f"sharing.{error}")
        y_train, y_test = dataset.y_train, dataset.y_test
        digest = row_digest(len(y_train), len(y_test))
    dtype = sharing_engine.DTYPES[config.dtype]
    labels, test_labels = ((2 * y - 1).to(dtype) for y in (y_train, y_test))
    strategy = ADMMSharing(config, labels, test_labels, digest)
    ledger = sharing_privacy.ledger(config, len(labels)) if config.private else None
    strategy.roster.admit(grid)  # the parties refuse what they cannot run, before a run folder is made
    with run_folder(config, ledger, lambda: strategy.kinds.values(), released=lambda: strategy.sent,
                    spent=lambda t: sharing_privacy.ledger(config, len(labels), t),
                    run_identity=strategy.run_identity) as writer:

        def evaluate(t: int, record: dict[str, float]) -> MetricRecord:
            record = {**record, "round": t, "seconds": strategy.seconds, "elapsed": strategy.elapsed}
            first = writer.last_round is None  # the first evaluated round names the majority class's error
            writer.record(record)
            if "test-error" not in record:  # a deployment: its parties send no test scores
                log(INFO, "dpadmm round %d/%d: primal residual %.4g (not tested: deployed parties send no "
                    "test scores)", t, config.rounds, record["primal-residual"])
                return metric_record(record)
            note = sharing_engine.error_note(record, majority=first)
            log(INFO, "dpadmm round %d/%d: test log loss %.6g, test error %.4f%s, primal residual %.4g", t,
                config.rounds, record["test-log-loss"], record["test-error"], f" ({note})" if note else "",
                record["primal-residual"])
            return metric_record(record)

        strategy.start(grid=grid, evaluate_fn=evaluate)


def iadmm_main(grid: Grid, config: RunConfig) -> None:
    """DP-IADMM (003, 000) and OutP: the strategy keeps every agent's state; agents keep none."""
    dataset = load_for(config)
    module = build_model(config.model, dataset.num_features, dataset.num_classes)
    parameters = initial_parameters(module, config.seed, dtype=DTYPES[config.dtype])
    resume = bool(config.out) and (Path(config.out) / CHECKPOINT).exists()
    # Every check before the run folder is made or reopened: the checkpoint's (it must be this run's), the
    # nodes' (their configuration and data), so that a refused run leaves no folder and a failed one's stays.
    strategy = DPIADMM(config, parameters, checkpoint_path=Path(config.out) / CHECKPOINT if resume else None)
    strategy.roster.admit(grid)
    ledger = strategy.statement(total_samples=dataset.num_train)
    if resume:
        writer = RunWriter(config.to_mapping(), engine="flower", directory=config.out,
                           save_weights=config.save_weights, resume_round=strategy.round,
                           run_identity=strategy.run_identity)
    else:
        writer = RunWriter(config.to_mapping(), engine="flower", directory=config.out or config.default_out(),
                           fresh=True, save_weights=config.save_weights, run_identity=strategy.run_identity)
        strategy.checkpoint_path = writer.directory / CHECKPOINT
    strategy.on_round = lambda report: writer.record_round(report.to_dict())
    opened(writer, "resuming" if resume else "writing", strategy.run_identity)
    if ledger:
        writer.write_ledger(ledger)
    last: dict[str, Any] = {}  # the last evaluated round's record, for the closing line

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0 or not (server_round % config.eval_every == 0 or server_round == config.rounds):
            return None
        params = {name: torch.tensor(array.numpy()) for name, array in arrays.items()}
        # Logistic regression is evaluated (and saved) as its one [J, K] tensor, as the engine does.
        w, model = (params["weight"], None) if config.model == "logistic" else (params, module)
        # The train loss reads the raw training data: a simulation's diagnostic, which no guarantee covers;
        # once a deployed node has replied, the server computes none.
        simulated = DEPLOYMENT not in strategy.kinds.values()
        record = {"round": server_round, **central_metrics(w, dataset, config.beta, model, train=simulated)}
        record.update(dict(strategy.last_train_metrics or {}))
        if strategy.last_report is not None:
            record["privacy-spent"] = strategy.last_report.privacy_spent
        writer.record(record, w)
        last.update(record)
        log(INFO, "dpadmm round %d/%d: test error %.4f, train loss %s, consensus violation %.4g",
            server_round, config.rounds, record["test-error"],
            f"{record['train-loss']:.4f}" if "train-loss" in record else "not computed (deployed nodes)",
            record.get("consensus-violation", float("nan")))
        return metric_record(record)

    if ledger:  # a run that stops early states what its agents spent (each was asked strategy.taken rounds)
        writer.spent = lambda k: privacy.ledger(config, rounds=k, total_samples=dataset.num_train)
    with closing([writer]):
        try:
            strategy.start(grid=grid, num_rounds=config.rounds, timeout=config.round_timeout,
                           evaluate_fn=evaluate)
        finally:  # before closing() marks a failed folder
            writer.completed = max(strategy.taken)
    ledger = strategy.statement(total_samples=dataset.num_train)
    if ledger:  # what the agents reported using (clients.randomness), said in the statement and privacy.json
        writer.write_ledger(ledger)
    log(INFO, "dpadmm: %s", ledger.summary() if ledger else "privacy: none (non-private run, no noise)")
    if ledger and last:
        log(INFO, "dpadmm: %s", privacy.headline(ledger, last["test-error"]))
    if ledger:
        log(INFO, "dpadmm: privacy spent, the largest over agents (they took part in %d to %d rounds): "
            "eps = %.4g at delta = %g (PLD)", min(strategy.taken), max(strategy.taken),
            privacy.spent(config, max(strategy.taken)), config.delta)

