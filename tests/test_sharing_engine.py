"""dpadmm.sharing.engine: non-private ADMM sharing reaches scikit-learn's optimum; keyed noise; run files."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from dpadmm.data import Dataset
from dpadmm.privacy import secure
from dpadmm.privacy.randomness import Secret
from dpadmm.sharing import engine, privacy, updates
from dpadmm.sharing.config import SharingConfig

F64 = torch.float64
CLOCKS = ("seconds", "elapsed")


def synthetic(n: int = 400, widths: tuple[int, ...] = (3, 4, 2)) -> Dataset:
    """A binary data set of n training rows (and 100 test rows) over the parties' columns ``widths``."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n + 100, sum(widths), generator=gen, dtype=F64)
    truth = torch.linspace(-2, 2, sum(widths), dtype=F64)
    y = (x @ truth + 0.5 * torch.randn(n + 100, generator=gen, dtype=F64) > 0).to(torch.int64)
    return Dataset(name="synthetic", x_train=x[:n], y_train=y[:n], x_test=x[n:], y_test=y[n:], num_classes=2)


def _config(**changes: object) -> SharingConfig:
    base = SharingConfig(epsilon=math.inf, parties="3,4,2", rounds=300, rho=1e-3, l2=1e-3, x_bound=1e6,
                         eval_every=300)
    return dataclasses.replace(base, **changes)


def test_non_private_sharing_reaches_scikit_learns_optimum() -> None:
    config = _config()
    problem = engine.build(synthetic(), config.widths)
    result = engine.run(config, problem=problem, write=False, progress=False)
    blocks = problem.parties.blocks
    features = torch.cat([blocks[m, :, :w] for m, w in enumerate(config.widths)], dim=1).numpy()
    labels = problem.labels.numpy()
    n = len(labels)
    model = LogisticRegression(C=1 / (n * config.l2), fit_intercept=False, tol=1e-12, max_iter=10000)
    w = model.fit(features, labels).coef_[0]
    optimum = float(np.logaddexp(0, -labels * (features @ w)).mean() + config.l2 * (w @ w) / 2)
    last = result.records[0][-1]
    assert last["train-objective"] == pytest.approx(optimum, rel=1e-6)
    assert last["primal-residual"] < 1e-6
    ours = torch.cat([result.state.x[0, m, :w] for m, w in enumerate(config.widths)]).numpy()
    np.testing.assert_allclose(ours, w, atol=1e-3)
    state = result.state  # Lemma 2 after the last round
    torch.testing.assert_close(updates.loss_gradient(state.z, problem.labels), state.y, rtol=0, atol=1e-15)


def test_without_noise_both_noise_modes_are_the_plain_algorithm_bit_for_bit() -> None:
    problem = engine.build(synthetic(), (3, 4, 2))
    runs = [engine.run(_config(noise=mode, rounds=20, eval_every=1), problem=problem, write=False,
                       progress=False).records[0] for mode in ("message", "paper")]
    assert [{k: v for k, v in r.items() if k not in CLOCKS} for r in runs[0]] == \
           [{k: v for k, v in r.items() if k not in CLOCKS} for r in runs[1]]


@pytest.mark.parametrize("mode", ["message", "paper"])
def test_noise_is_keyed_by_seed_and_batched_runs_equal_separate_ones(mode: str) -> None:
    problem = engine.build(synthetic(), (3, 4, 2))
    config = _config(epsilon=1.0, noise=mode, rounds=5, eval_every=1, x_bound=2.0)
    both = engine.run(config, seeds=[3, 8], problem=problem, write=False, progress=False)
    alone = engine.run(config, seeds=[8], problem=problem, write=False, progress=False)
    assert both.records[0] != both.records[1]
    for batched, single in zip(both.records[1], alone.records[0], strict=True):  # equal up to summation order
        assert {k: v for k, v in batched.items() if k not in CLOCKS} == \
            pytest.approx({k: v for k, v in single.items() if k not in CLOCKS}, rel=1e-12, abs=1e-15)


def test_the_message_noise_has_the_calibrated_variance() -> None:
    problem = engine.build(synthetic(n=2000, widths=(9,)), (9,))
    config = _config(epsilon=1.0, parties="9", x_bound=0.01)
    std = privacy.noise_std(config, problem.num_samples)
    assert std == pytest.approx(privacy.theorem_3_std(1.0, 1e-5, 2 * 0.01 * math.sqrt(2000)))
    x = torch.zeros((1, 1, 9), dtype=F64)
    _, messages = engine.release(problem.parties, x, [0], 1, std, "message")
    assert float(messages.std()) == pytest.approx(std, rel=0.05) and abs(float(messages.mean())) < 0.1 * std


def test_a_noise_level_of_the_callers_replaces_theorem_3s_and_is_not_written() -> None:
    """001's Fig. 3 sweeps sigma directly: the run with std = Theorem 3's sigma equals the private run."""
    problem = engine.build(synthetic(), (3, 4, 2))
    private = _config(epsilon=0.5, rounds=4, eval_every=1, x_bound=1.0)
    std = privacy.noise_std(private, problem.num_samples)
    ours = engine.run(_config(rounds=4, eval_every=1, x_bound=1.0), problem=problem, write=False,
                      progress=False, std=std)
    theirs = engine.run(private, problem=problem, write=False, progress=False)
    assert ours.ledger is None and theirs.ledger is not None
    assert [{k: v for k, v in r.items() if k not in CLOCKS} for r in ours.records[0]] == \
           [{k: v for k, v in r.items() if k not in CLOCKS} for r in theirs.records[0]]
    with pytest.raises(ValueError, match="std=1.0 is not allowed with write=True"):
        engine.run(private, problem=problem, progress=False, std=1.0)


def test_a_run_writes_its_files_and_a_private_one_its_ledger(tmp_path: Path) -> None:
    problem = engine.build(synthetic(), (3, 4, 2))
    config = _config(epsilon=0.5, rounds=3, eval_every=1, x_bound=1.0)
    engine.run(config, problem=problem, directories=[tmp_path / "run"], progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [1, 2, 3]
    assert set(lines[0]) == {"round", "train-objective", "test-log-loss", "test-error", "test-majority",
                             "test-undecided", "primal-residual", *CLOCKS}
    ledger = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert ledger["calibration"] == "Theorem 3 (001)" and ledger["whole_run"]["releases"] == 3


def test_a9a_splits_as_the_paper_and_learns(binary_dir: Path) -> None:
    config = SharingConfig(epsilon=math.inf, data_dir=str(binary_dir / "a9a"), rounds=30, eval_every=30)
    result = engine.run(config, write=False, progress=False)
    assert result.problem.widths == (66, 57) and result.problem.num_samples == 32561
    norms = torch.linalg.vector_norm(result.problem.parties.blocks, dim=-1)
    assert bool(((norms - 1).abs() < 1e-12).logical_or(norms == 0).all())  # each block's rows: unit norm
    assert result.records[0][-1]["test-error"] < 0.16


@pytest.mark.parametrize("mode", ["message", "paper"])
def test_one_party_alone_computes_its_row_of_the_batch(mode: str) -> None:
    """What a Flower client will do: a party holding only its own block, with its own id, sends the message
    the batched engine computes for it (the same x-step and the same keyed noise)."""
    dataset, widths = synthetic(), (3, 4, 2)
    config = _config(epsilon=1.0, rounds=3, x_bound=1.0, noise=mode)
    problem = engine.build(dataset, widths)
    state = engine.run(config, problem=problem, write=False, progress=False).state
    std = privacy.noise_std(config, problem.num_samples)
    rho = config.penalty(problem.num_samples)
    pulled = state.messages.sum(dim=1) - state.z
    both = engine.party_step(problem.parties, pulled, state.messages, state.y, config, rho, [0], 4, std)
    for m in range(3):
        alone = engine.parties_of(dataset, widths, [m])
        own = state.messages[:, m:m + 1]
        x, message = engine.party_step(alone, pulled, own, state.y, config, rho, [0], 4, std)
        torch.testing.assert_close(message[:, 0], both[1][:, m], rtol=1e-12, atol=1e-9)
        torch.testing.assert_close(x[:, 0, :widths[m]], both[0][:, m, :widths[m]], rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- deployment randomness


def _keys(parties: int) -> Secret:
    return Secret({m: secure.new_key() for m in range(parties)})


def test_deployment_randomness_releases_each_message_from_its_partys_key() -> None:
    """engine.iterate with every party's key: not the keyed run; the same keys give the same round, other
    keys (another run identity) other messages; a party alone with its own key sends its row of the batch;
    the messages lie on the grid Gaussian mechanism's grid."""
    dataset, widths = synthetic(), (3, 4, 2)
    problem = engine.build(dataset, widths)
    config = _config(epsilon=1.0, rounds=2, x_bound=1.0)
    std = privacy.noise_std(config, problem.num_samples)
    start = engine.initial_state(problem, 1)
    keyed = engine.iterate(problem, start, config, [0], 1, std)
    keys = _keys(3)
    secret = engine.iterate(problem, start, config, [0], 1, std, keys)
    again = engine.iterate(problem, start, config, [0], 1, std, Secret(dict(keys.keys)))
    other = engine.iterate(problem, start, config, [0], 1, std, _keys(3))
    assert not torch.equal(keyed.messages, secret.messages) and torch.equal(secret.messages, again.messages)
    assert not (secret.messages == other.messages).any()
    grid = secure.grid("gaussian", std, problem.num_samples)
    assert torch.equal(torch.round(secret.messages / grid), secret.messages / grid)
    assert float((secret.messages - updates.scores(problem.parties.blocks, secret.x)).std()) == \
        pytest.approx(std, rel=0.1)
    rho = config.penalty(problem.num_samples)
    for m in range(3):
        alone = engine.parties_of(dataset, widths, [m])
        _, message = engine.party_step(alone, start.messages.sum(dim=1) - start.z, start.messages[:, m:m + 1],
                                       start.y, config, rho, [0], 1, std, Secret({m: keys.keys[m]}))
        torch.testing.assert_close(message[:, 0], secret.messages[:, m], rtol=0, atol=2 * grid)


def test_a_deployed_message_depends_on_the_scores_only_through_the_grid() -> None:
    keys = _keys(2)
    ids = torch.tensor([0, 1])
    generator = torch.Generator().manual_seed(1)
    scores = torch.randn((1, 2, 500), dtype=F64, generator=generator)
    std = 3.0
    grid = secure.grid("gaussian", std, 500)
    cell = torch.round(scores / grid) * grid
    within = cell + (scores - cell) / 2  # the same cell: |offset| <= grid / 4
    assert not torch.equal(within, scores)
    sent = engine.deployed_messages(scores, ids, 2, std, keys)
    assert torch.equal(engine.deployed_messages(within, ids, 2, std, keys), sent)
    assert torch.equal(engine.deployed_messages(scores + 5 * grid, ids, 2, std, keys), sent + 5 * grid)
    assert torch.equal(engine.deployed_messages(scores, ids, 2, 0.0, keys), scores)  # non-private: no noise


def test_the_papers_noise_has_no_deployed_form_and_the_engine_states_its_randomness() -> None:
    problem = engine.build(synthetic(), (3, 4, 2))
    config = _config(epsilon=1.0, noise="paper", rounds=2, x_bound=1.0)
    start = engine.initial_state(problem, 1)
    with pytest.raises(ValueError, match=r"^noise='paper' is not allowed with deployment randomness: .* use "
                                         "noise='message'$"):
        engine.iterate(problem, start, config, [0], 1, 1.0, _keys(3))
    with pytest.raises(ValueError, match=r"seeds=\[0, 1\] is not allowed with deployment randomness"):
        engine.release(problem.parties, start.x.expand(2, -1, -1), [0, 1], 1, 1.0, "message", _keys(3))
    result = engine.run(config, problem=problem, write=False, progress=False)
    assert result.ledger is not None and "simulation randomness" in result.ledger.summary()


def test_round_1_decides_nothing_and_the_lines_say_so_beside_the_majority_class() -> None:
    """After round 1 every party's x is still 0 (y_0 = z_0 = 0): every test score is 0, which counts as an
    error, so the test error is 1. The record says how much of it is undecided, and the printed line says so
    beside what always predicting the majority class would err on; a later round decides every sample."""
    problem = engine.build(synthetic(), (3, 4, 2))
    records = engine.run(_config(rounds=3, eval_every=1), problem=problem, write=False,
                         progress=False).records[0]
    positive = float((problem.test_labels > 0).double().mean())
    majority = max(positive, 1 - positive)
    assert [r["test-majority"] for r in records] == [majority] * 3
    assert records[0]["test-error"] == 1.0 and records[0]["test-undecided"] == 1.0
    assert records[-1]["test-undecided"] == 0.0 and records[-1]["test-error"] < 1 - majority
    assert engine.error_note(records[0], majority=True) == (
        f"always predicting the majority class errs on {1 - majority:.4f}; 1.0000 of the test scores are 0: "
        "no decision, counted as errors")
    assert engine.error_note(records[-1], majority=False) == ""
    config = _config(rounds=3)
    assert engine.summary(config, records[-1]).endswith(
        f"test error {records[-1]['test-error']:.4f} (always predicting the majority class errs on "
        f"{1 - majority:.4f})")
