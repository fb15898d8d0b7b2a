"""Paper 004 on Flower for real: `flwr run .` with one SuperNode per agent and a ServerApp that only routes
the exchanged iterates along the graph equals the engine iteration by iteration; with exchange=secret
Flower's SecAgg+ sums the iterates, and the agents' updates from that sum are the engine's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat

from clients.decentral import iterate_reply, secure_sum_mod, sum_reply
from dpadmm.data.adult import load_adult
from dpadmm.decentral import engine
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import Agents, agent_view
from dpadmm.decentral.problem import build as build_problem
from dpadmm.privacy.randomness import NodeSecret, Secret, new_run_identity, run_key
from dpadmm.runs.results import read_metrics
from dpadmm.wire import EXCHANGED_KEY, MECHANISM_KEY, NEIGHBOURS_KEY
from strategies.decentral import SecureSum
from tests.conftest import (
    ROOT,
    SHARED_DATA,
    flwr_run,
    replace_one_device,
    run_config_of,
    unexplained_warnings,
)


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "partition"), [("ldp-admm", "contiguous"),
                                                       ("ldp-dgd-star", "dirichlet:0.5")])
def test_flower_run_equals_the_engine_iteration_by_iteration(algorithm: str, partition: str,
                                                             flwr_env: dict[str, str], tmp_path: Path,
                                                             binary_dir: Path) -> None:
    """Every agent's ClientApp takes its own samples of the run's draw, dealt by the partition (label skew
    in the second case), and the run equals the engine's."""
    out = tmp_path / "flower"
    config = DecentralConfig(algorithm=algorithm, agents=5, edges=6, rounds=4, seed=3, partition=partition,
                             data_dir=str(binary_dir / "adult"), out=str(out))
    output = flwr_run(flwr_env, run_config_of(config), supernodes=5)
    assert "dpadmm iteration 4/4: log-error" in output and "-LDP, pure, a priori" in output
    assert "Randomness: simulation randomness" in output  # the simulated agents said so themselves
    evaluated = output.split("ServerApp-side Evaluate Metrics:")[1]  # Flower's closing summary holds them
    assert "'log-error': " in evaluated and "'consensus': " in evaluated
    flower = read_metrics(out)
    local = engine.run(config, write=False, progress=False).records[0]
    assert [r["round"] for r in flower] == [1, 2, 3, 4]
    for ours, theirs in zip(flower, local, strict=True):
        for key in ("log-error", "log-error-max", "consensus", "epsilon"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-12), (key, ours["round"])


@pytest.mark.slow
def test_the_family_pages_flwr_run_prints_the_figures_dpadmm_train_prints(flwr_env: dict[str, str],
                                                                          tmp_path: Path,
                                                                          binary_dir: Path) -> None:
    """docs/families/decentral.md's `flwr run .` (10 SuperNodes, algorithm='ldp-admm', no data-dir: a
    simulated server reads the data set from the cache, as its agents do) ends with the log-error, worst
    agent and consensus that `dpadmm train` prints and the page states; every warning it prints is dpadmm's
    or one the README lists as harmless."""
    env = dict(flwr_env)
    if binary_dir.is_relative_to(SHARED_DATA):  # the cache filled from ../shared/data, as a user's fetch
        env["DPADMM_DATA_MIRRORS"] = SHARED_DATA.as_uri()
    output = flwr_run(env, f"algorithm='ldp-admm' decentral.out='{tmp_path / 'run'}'", supernodes=10)
    page = (ROOT / "docs" / "families" / "decentral.md").read_text()
    stated = re.search(r"print the same numbers \(log-error (\S+), worst agent (\S+),\s+consensus (\S+), ",
                       page)
    printed = re.search(r"iteration 100/100: log-error (\S+) \(worst agent (\S+)\), consensus (\S+)\n",
                        output)
    assert stated, "decentral.md no longer states the figures of its commands"
    assert printed, output[-3000:]
    assert printed.groups() == stated.groups()
    assert not unexplained_warnings(output)


@pytest.mark.slow
def test_secagg_plus_run_equals_the_engine_up_to_its_quantisation(flwr_env: dict[str, str], tmp_path: Path,
                                                                  binary_dir: Path) -> None:
    """exchange=secret through a real `flwr run`: SecAgg+ (four stages an iteration, masks, Shamir shares)
    delivers the sum, and the average's error follows the engine's exchange=secret run (Algorithm 3) to
    within SecAgg+'s quantisation (steps of 2 * 32 / 2^22)."""
    out = tmp_path / "secagg"
    config = DecentralConfig(graph="complete", agents=5, exchange="secret", rounds=4, seed=3,
                             data_dir=str(binary_dir / "adult"), out=str(out))
    output = flwr_run(flwr_env, run_config_of(config), supernodes=5)
    assert output.count("Secure aggregation completed.") == 4 and "-LDP, pure, a priori" in output
    assert "Randomness: simulation randomness" in output  # reported through SecAgg+'s fit metrics
    # Flower's legacy summary: the average's log-error as the centralised loss, the record as its metrics
    assert "History (loss, centralized):" in output and "'log-error-average': " in output
    flower = read_metrics(out)
    local = engine.run(config, write=False, progress=False).records[0]
    assert [r["round"] for r in flower] == [1, 2, 3, 4]
    for ours, theirs in zip(flower, local, strict=True):
        k = ours["round"]
        assert ours["log-error-average"] == pytest.approx(theirs["log-error-average"], abs=1e-4), k
        assert ours["epsilon"] == pytest.approx(theirs["epsilon"], rel=1e-12)



def _fit_message(total: np.ndarray, k: int) -> Message:
    instruction = FitIns(ndarrays_to_parameters([total]), {"server-round": k})
    content = recorddict_compat.fitins_to_recorddict(instruction, keep_input=True)
    return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


def _context() -> Context:
    """A node's context outside Flower's simulation engine, forced to the simulation kind (keyed by the seed,
    as the engine's draws): a test process is no simulated node, and would otherwise take the deployment kind
    (tests/test_decentral_randomness.py tests that one)."""
    return Context(run_id=1, node_id=1, node_config={"randomness": "simulation"}, state=RecordDict(),
                   run_config={})


def _iterate(reply: Message) -> np.ndarray:
    return parameters_to_ndarrays(recorddict_compat.recorddict_to_fitres(reply.content, True).parameters)[0]


@pytest.mark.usefixtures("server_process")
def test_the_agents_updates_from_the_sum_are_the_engines(binary_dir: Path) -> None:
    """Five agents answering the server's S^{k-1} (each with its own context) release exactly the engine's
    x^k of Algorithm 1 on the complete graph, whose neighbour sums are S - x_i; the server's S^0 is the sum
    of the keyed x^0."""
    config = DecentralConfig(graph="complete", agents=5, exchange="secret", rounds=3, seed=2,
                             data_dir=str(binary_dir / "adult"))
    dataset = load_adult(config.data_dir)
    views = [agent_view(config, dataset, i) for i in range(config.agents)]
    contexts = [_context() for _ in range(config.agents)]
    server = SecureSum(config, views[0])
    total = parameters_to_ndarrays(server.initialize_parameters(client_manager=None))[0]  # type: ignore[arg-type]
    plain = dataclasses.replace(config, exchange="plain")
    problem = build_problem(plain, dataset, [config.seed])
    state = engine.start(plain, problem.agents, [config.seed])
    assert np.allclose(total, state.x[0].sum(dim=0).numpy(), rtol=1e-14, atol=1e-14)
    for k in range(1, config.rounds + 1):
        released = np.stack([_iterate(sum_reply(_fit_message(total, k), contexts[i], config, views[i], i))
                             for i in range(config.agents)])
        state, _ = engine.iterate(plain, problem.agents, state, [config.seed], k)
        np.testing.assert_allclose(released, state.x[0].numpy(), rtol=1e-11, atol=1e-12)
        total = released.sum(axis=0)


@pytest.mark.usefixtures("server_process")
def test_an_agent_refuses_what_secagg_would_clip_and_a_missed_iteration(binary_dir: Path) -> None:
    config = DecentralConfig(graph="complete", agents=5, exchange="secret", seed=2, secagg_range=0.5,
                             data_dir=str(binary_dir / "adult"))
    view = agent_view(config, load_adult(config.data_dir), 0)
    total = np.zeros(14)
    with pytest.raises(ValueError, match="outside secagg-range=0.5, which SecAgg"):
        sum_reply(_fit_message(total, 1), _context(), config, view, 0)
    with pytest.raises(ValueError, match="holds no iterate of iteration 2"):
        sum_reply(_fit_message(total, 3), _context(), config, view, 0)


def test_the_secure_sum_stops_when_an_iterate_is_missing(binary_dir: Path) -> None:
    """Algorithm 1 needs every agent's iterate: a sum of fewer, or an iteration whose sum never arrived (a
    halted SecAgg+), stops the run with the iteration named; 1024 agents overflow SecAgg+'s modulus."""
    config = DecentralConfig(graph="complete", agents=5, exchange="secret",
                             data_dir=str(binary_dir / "adult"))
    view = agent_view(config, load_adult(config.data_dir), 0)
    server = SecureSum(config, view)
    ok = Status(code=Code.OK, message="")
    stated = {MECHANISM_KEY: server.mechanism}
    results = [(None, FitRes(ok, ndarrays_to_parameters([np.ones(14)]), 1, stated)) for _ in range(4)]
    with pytest.raises(RuntimeError, match="iteration 3: 4 of the 5 agents' iterates were summed"):
        server.aggregate_fit(3, results, [])  # type: ignore[arg-type]
    other = FitRes(ok, ndarrays_to_parameters([np.ones(14)]), 1, {"partition-id": 4, MECHANISM_KEY: "none"})
    with pytest.raises(RuntimeError, match="iteration 3: agent 4 ran 'none', not this run's 'laplace, "
                                           "a-priori epsilon .*': the run's privacy statement would not "
                                           "cover the sum"):
        server.aggregate_fit(3, [*results, (None, other)], [])  # type: ignore[arg-type]
    server.aggregate_fit(3, [*results, results[0]], [])  # type: ignore[arg-type]
    assert torch.equal(server.total, torch.full((14,), 5.0, dtype=torch.float64))
    assert server.evaluate(3, ndarrays_to_parameters([])) is None  # no evaluate_fn: nothing for the history
    # the ServerApp's record reaches Flower's legacy summary: the average's log-error as the loss; a server
    # without the data set (no log-error) gives none, rather than a made-up loss
    server.evaluate_fn = lambda k, total: {"round": k, "log-error-average": -2.5, "epsilon": 0.5}
    assert server.evaluate(3, ndarrays_to_parameters([])) == (-2.5, {"round": 3, "log-error-average": -2.5,
                                                                     "epsilon": 0.5})
    server.evaluate_fn = lambda k, total: {"round": k, "epsilon": 0.5}
    assert server.evaluate(3, ndarrays_to_parameters([])) is None
    with pytest.raises(RuntimeError, match="iteration 4: the secure aggregation halted"):
        server.evaluate(4, ndarrays_to_parameters([]))
    many = DecentralConfig(graph="complete", agents=1024, samples=1, exchange="secret")
    wide = type(view)(features=torch.zeros(1, 1024, 1, 14), labels=torch.zeros(1, 1024, 1),
                      adjacency=torch.ones(1, 1024, 1024, dtype=torch.bool))
    with pytest.raises(ValueError, match="agents=1024 is too many for SecAgg"):
        SecureSum(many, wide)


@pytest.mark.usefixtures("server_process")
def test_the_mod_leaves_every_other_message_alone() -> None:
    message = _fit_message(np.zeros(3), 1)
    assert secure_sum_mod(message, _context(), lambda msg, context: msg) is message


# ----------------------------------------------------------------------------- deployment randomness


def _deployed(folder: Path) -> Context:
    """A deployed node's context: the deployment kind (forced, as a test process is no SuperNode) and its own
    state folder, where its secret and its record of answered iterations live, with a policy that holds runs
    to 004's relation (one sample replaced)."""
    return Context(run_id=1, node_id=1, node_config={"randomness": "deployment",
                                                     "state-dir": str(replace_one_device(folder))},
                   state=RecordDict(), run_config={})


def _asked(config: DecentralConfig, view: Agents, x: torch.Tensor, agent: int, k: int, identity: str
           ) -> Message:
    """The router's message of iteration k to ``agent`` (strategies.decentral.GraphRouter.configure_train):
    x^{k-1} of the agent and its neighbours, their ids, the run identity."""
    around = [agent, *(int(j) for j in torch.nonzero(view.adjacency[0, agent]).flatten())]
    content = RecordDict({
        "arrays": ArrayRecord({EXCHANGED_KEY: Array(x[around].numpy())}),
        "config": ConfigRecord({"server-round": k, "partition-id": agent, NEIGHBOURS_KEY: around,
                                "run-identity": identity}),
    })
    return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=agent + 1)


def _sent(reply: Message) -> torch.Tensor:
    return torch.from_numpy(np.array(reply.content["arrays"][EXCHANGED_KEY].numpy(), copy=True))


def _engine_keys(root: Path, identity: str, agents: int) -> Secret:
    """Every agent's key for the run ``identity``, read from the nodes' state folders (as only their owners
    can)."""
    return Secret({i: run_key(NodeSecret(root / f"node-{i}", i).secret(), identity, i)
                   for i in range(agents)})


@pytest.mark.usefixtures("server_process")
def test_deployed_agents_send_what_the_engine_computes_from_their_keys(binary_dir: Path,
                                                                      tmp_path: Path) -> None:
    """Four deployed agents answer three routed iterations of Algorithm 1 (each its own context and state
    folder): each reply is the engine's iteration given every node's key for the run identity, the replies
    report the deployment kind, and another run identity (another run of the same run config) sends other
    iterates."""
    config = DecentralConfig(agents=4, edges=4, rounds=3, seed=2, data_dir=str(binary_dir / "adult"))
    dataset = load_adult(config.data_dir)
    views = [agent_view(config, dataset, i) for i in range(config.agents)]
    built = build_problem(config, dataset, [config.seed])
    firsts = []
    for run in ("one", "two"):
        identity = new_run_identity()
        contexts = [_deployed(tmp_path / run / f"node-{i}") for i in range(config.agents)]
        state = engine.start(config, built.agents, [config.seed])
        x = state.x[0].clone()
        for k in range(1, config.rounds + 1):
            replies = [iterate_reply(_asked(config, views[i], x, i, k, identity), contexts[i], config,
                                     views[i], i) for i in range(config.agents)]
            assert {str(r.content["config"]["randomness"]) for r in replies} == {"deployment"}
            x = torch.stack([_sent(r) for r in replies])
            keys = _engine_keys(tmp_path / run, identity, config.agents)
            state, _ = engine.iterate(config, built.agents, state, [config.seed], k, keys)
            torch.testing.assert_close(x, state.x[0], rtol=0, atol=1e-9)  # one grid cell at most (2^-36)
        firsts.append(x)
        keyed = engine.run(config, dataset=dataset, write=False, progress=False).state.x[0]
        assert not torch.equal(x, keyed)  # nothing of the seed-keyed run
    assert not (firsts[0] == firsts[1]).any()  # two runs: new weights and noise for every coordinate


@pytest.mark.usefixtures("server_process")
def test_a_deployed_agent_repeats_an_iteration_but_answers_no_other_request_for_it(binary_dir: Path,
                                                                                  tmp_path: Path) -> None:
    config = DecentralConfig(agents=4, edges=4, rounds=3, seed=2, data_dir=str(binary_dir / "adult"))
    view = agent_view(config, load_adult(config.data_dir), 0)
    x = engine.initial_state(view, [config.seed]).x[0]
    identity = new_run_identity()
    first = iterate_reply(_asked(config, view, x, 0, 1, identity), _deployed(tmp_path), config, view, 0)
    # the same request again (a node whose context was lost at iteration 1, which needs no dual): the same
    again = iterate_reply(_asked(config, view, x, 0, 1, identity), _deployed(tmp_path), config, view, 0)
    assert torch.equal(_sent(first), _sent(again))
    with pytest.raises(ValueError, match="already answered round 1 of this run for another request"):
        iterate_reply(_asked(config, view, x + 1e-9, 0, 1, identity), _deployed(tmp_path), config, view, 0)
    other = iterate_reply(_asked(config, view, x, 0, 1, new_run_identity()), _deployed(tmp_path), config,
                          view, 0)
    assert not torch.equal(_sent(first), _sent(other))
    with pytest.raises(ValueError, match="no run identity"):
        iterate_reply(_asked(config, view, x, 0, 1, ""), _deployed(tmp_path), config, view, 0)


@pytest.mark.usefixtures("server_process")
def test_deployed_agents_of_the_secagg_form_send_what_the_engine_computes(binary_dir: Path,
                                                                         tmp_path: Path) -> None:
    """exchange=secret: each agent answers the server's S^{k-1} (and the run identity, in its fit config)
    with the engine's release under its node's key, and reports its kind in its fit metrics, which SecAgg+
    hands on to the server."""
    config = DecentralConfig(graph="complete", agents=4, exchange="secret", rounds=2, seed=2,
                             data_dir=str(binary_dir / "adult"))
    dataset = load_adult(config.data_dir)
    views = [agent_view(config, dataset, i) for i in range(config.agents)]
    contexts = [_deployed(tmp_path / f"node-{i}") for i in range(config.agents)]
    server = SecureSum(config, views[0])
    total = parameters_to_ndarrays(server.initialize_parameters(client_manager=None))[0]  # type: ignore[arg-type]
    plain = dataclasses.replace(config, exchange="plain")
    built = build_problem(plain, dataset, [config.seed])
    state = engine.start(plain, built.agents, [config.seed])
    for k in range(1, config.rounds + 1):
        asked = FitIns(ndarrays_to_parameters([total]),
                       {"server-round": k, "run-identity": server.run_identity})
        message = Message(content=recorddict_compat.fitins_to_recorddict(asked, keep_input=True),
                          dst_node_id=1, message_type=MessageType.TRAIN)
        replies = [sum_reply(message, contexts[i], config, views[i], i) for i in range(config.agents)]
        results = [recorddict_compat.recorddict_to_fitres(r.content, True) for r in replies]
        assert {str(r.metrics["randomness"]) for r in results} == {"deployment"}
        released = np.stack([_iterate(r) for r in replies])
        state, _ = engine.iterate(plain, built.agents, state, [config.seed], k,
                                  _engine_keys(tmp_path, server.run_identity, config.agents))
        np.testing.assert_allclose(released, state.x[0].numpy(), rtol=0, atol=1e-9)
        server.aggregate_fit(k, [(None, r) for r in results], [])  # type: ignore[misc]
        assert server.kinds == dict.fromkeys(range(config.agents), "deployment")
        total = released.sum(axis=0)
