"""clients.sharing: a party of ADMM sharing (001) answering the server's messages, in each kind of randomness.

Each party is called directly, as the ClientApp calls it, with its own context and state folder. Forced to
the simulation kind it sends the engine's keyed message (the Flower simulations in test_sharing_flower.py
show the same through `flwr run`); as a deployed node it sends the grid release of its message under its
node's own secret for the run identity the server sends, which the engine reproduces given every party's key.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from clients.sharing import round_reply
from dpadmm.data import Dataset
from dpadmm.privacy import secure
from dpadmm.privacy.randomness import NodeSecret, Secret, new_run_identity, run_key
from dpadmm.sharing import engine, privacy
from dpadmm.sharing.config import SharingConfig
from dpadmm.wire import DUAL_KEY, MESSAGE_KEY, PULLED_KEY
from tests.conftest import replace_one_device
from tests.test_sharing_engine import synthetic

F64 = torch.float64
WIDTHS = (3, 4, 2)



def _config(**changes: object) -> SharingConfig:
    settings: dict[str, object] = {"epsilon": 1.0, "parties": "3,4,2", "rounds": 3, "rho": 1e-3, "l2": 1e-3,
                                   "x_bound": 1.0, "seed": 3, **changes}
    return SharingConfig(**settings)  # type: ignore[arg-type]


def _node(folder: Path | None) -> Context:
    """A party's context: deployed with its state folder (its operator's policy holds runs to 001's relation,
    one sample replaced), or (None) forced to the simulation kind."""
    node = {"randomness": "simulation"} if folder is None else {"randomness": "deployment",
                                                                "state-dir": str(replace_one_device(folder))}
    return Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config={})


def _asked(pulled: torch.Tensor, y: torch.Tensor, party: int, t: int, own_round: int, identity: str
           ) -> Message:
    """The server's train message of round t to ``party`` (strategies.sharing.ADMMSharing.configure_train)."""
    content = RecordDict({
        "arrays": ArrayRecord({PULLED_KEY: Array(pulled.numpy()), DUAL_KEY: Array(y.numpy())}),
        "config": ConfigRecord({"server-round": t, "partition-id": party, "own-round": own_round,
                                "run-identity": identity}),
    })
    return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=party + 1)


def _message(reply: Message) -> torch.Tensor:
    return torch.from_numpy(np.array(reply.content["arrays"][MESSAGE_KEY].numpy(), copy=True))


def _rounds(config: SharingConfig, dataset: Dataset, contexts: list[Context], identity: str
            ) -> tuple[list[torch.Tensor], list[str]]:
    """Every round of ``config`` with the three parties answering through round_reply and the server's steps
    in between (as ADMMSharing takes them): the messages of each round and the kinds reported."""
    problem = engine.build(dataset, WIDTHS)
    n = problem.num_samples
    messages, z, y = problem.labels.new_zeros((1, 3, n)), problem.labels.new_zeros((1, n)), \
        problem.labels.new_zeros((1, n))
    sent, kinds = [], []
    for t in range(1, config.rounds + 1):
        pulled = (messages.sum(dim=1) - z)[0]
        replies = [round_reply(_asked(pulled, y[0], m, t, t - 1, identity), contexts[m], config,
                               engine.parties_of(dataset, WIDTHS, [m]), m, "ids") for m in range(3)]
        kinds += [str(r.content["config"]["randomness"]) for r in replies]
        messages = torch.stack([_message(r) for r in replies]).unsqueeze(0)
        z, y = engine.server_step(messages, y, problem.labels, config.penalty(n))
        sent.append(messages)
    return sent, kinds


def _replayed(config: SharingConfig, dataset: Dataset, randomness: Secret | None) -> list[torch.Tensor]:
    """The engine's messages of every round, keyed by the seed (None) or with the parties' keys."""
    problem = engine.build(dataset, WIDTHS)
    std = privacy.noise_std(config, problem.num_samples)
    state, out = engine.initial_state(problem, 1), []
    for t in range(1, config.rounds + 1):
        state = engine.iterate(problem, state, config, [config.seed], t, std, randomness)
        out.append(state.messages)
    return out


@pytest.mark.usefixtures("server_process")
def test_simulated_parties_send_the_engines_keyed_messages() -> None:
    config, dataset = _config(), synthetic(widths=WIDTHS)
    sent, kinds = _rounds(config, dataset, [_node(None) for _ in range(3)], new_run_identity())
    assert set(kinds) == {"forced-simulation"}  # a test process is no simulated node: it says it was forced
    for ours, theirs in zip(sent, _replayed(config, dataset, None), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-9)


@pytest.mark.usefixtures("server_process")
def test_deployed_parties_send_what_the_engine_computes_from_their_keys(tmp_path: Path) -> None:
    """Three deployed parties for three rounds: each message is the engine's under every party's key for the
    run identity; another run (identity) of the same config sends other messages; neither is the seed's."""
    config, dataset = _config(), synthetic(widths=WIDTHS)
    runs = []
    for run in ("one", "two"):
        identity = new_run_identity()
        sent, kinds = _rounds(config, dataset, [_node(tmp_path / run / f"party-{m}") for m in range(3)],
                              identity)
        assert set(kinds) == {"deployment"}
        keys = Secret({m: run_key(NodeSecret(tmp_path / run / f"party-{m}", m).secret(), identity, m)
                       for m in range(3)})
        grid = secure.grid("gaussian", privacy.noise_std(config, 400), 400)
        for ours, theirs in zip(sent, _replayed(config, dataset, keys), strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=2 * grid)  # a grid cell at most
        runs.append(sent)
    assert not (runs[0][0] == runs[1][0]).any()
    keyed = _replayed(config, dataset, None)
    assert not (runs[0][0] == keyed[0]).any()


@pytest.mark.usefixtures("server_process")
def test_a_deployed_party_repeats_a_round_and_refuses_another_request_and_the_papers_noise(tmp_path: Path
                                                                                          ) -> None:
    config, dataset = _config(), synthetic(widths=WIDTHS)
    party = engine.parties_of(dataset, WIDTHS, [1])
    zeros = torch.zeros(400, dtype=F64)
    identity = new_run_identity()
    first = round_reply(_asked(zeros, zeros, 1, 1, 0, identity), _node(tmp_path), config, party, 1, "ids")
    again = round_reply(_asked(zeros, zeros, 1, 1, 0, identity), _node(tmp_path), config, party, 1, "ids")
    assert torch.equal(_message(first), _message(again))  # a restarted party asked the same: the same
    with pytest.raises(ValueError, match="already answered round 1 of this run for another request"):
        round_reply(_asked(zeros + 1e-12, zeros, 1, 1, 0, identity), _node(tmp_path), config, party, 1, "ids")
    paper = _config(noise="paper")
    with pytest.raises(ValueError, match=r"^noise='paper' is not allowed with deployment randomness"):
        round_reply(_asked(zeros, zeros, 1, 1, 0, identity), _node(tmp_path), paper, party, 1, "ids")
    simulated = round_reply(_asked(zeros, zeros, 1, 1, 0, identity), _node(None), paper, party, 1, "ids")
    assert simulated.content["config"]["randomness"] == "forced-simulation"  # the paper's noise, keyed


def test_a_server_outside_the_simulation_engine_refuses_the_papers_noise_on_one_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The ServerApp's main for ADMM sharing on a grid that is not Flower's in-memory one (here none): its
    parties would take the deployment kind and refuse noise = paper, so the server refuses it first, before
    it reads anything or makes a run folder; forced to the simulation kind it would run it."""
    from server.server_app import RunConfigError, sharing_main

    monkeypatch.delenv("DPADMM_RANDOMNESS", raising=False)
    out = tmp_path / "refused"
    config = SharingConfig(noise="paper", epsilon=1.0, data_dir=str(tmp_path / "absent"), out=str(out))
    with pytest.raises(RunConfigError, match=r"^noise='paper' is not allowed with deployment randomness: .* "
                                             "use noise='message'$"):
        sharing_main(None, config)  # type: ignore[arg-type]  # refused before the grid is used
    assert not out.exists()
    monkeypatch.setenv("DPADMM_RANDOMNESS", "simulation")
    with pytest.raises(OSError):  # past the refusal: it reads the (absent) data set
        sharing_main(None, config)  # type: ignore[arg-type]
