"""The batched engine: the reference facts of DESIGN.md, determinism, and its output files."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.iadmm import engine, schedules
from dpadmm.iadmm.config import RunConfig, main_job, papers
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.runs.results import read_metrics

# Authors' reference code, MNIST, P = 10 contiguous blocks, pixels / 255, non-private, iteration 41: the
# test error of the w it holds then and the residual of iteration 41's dual update.
REFERENCE = {"objp": (0.2296, 6.652e-3), "outp": (0.3123, 0.1163)}


@pytest.mark.parametrize("algorithm", ["objp", pytest.param("outp", marks=pytest.mark.slow)])  # 4 s each
def test_reference_facts_on_mnist(algorithm: str, mnist_dir: Path) -> None:
    """The reference code evaluates, at iteration 41, the w that ObjP's iteration 41 sent (computed before
    its replies: our model after round 40) and the w that OutP computed after its replies (our model after
    round 41); its residual is round 41's either way."""
    config = papers(algorithm=algorithm, epsilon=math.inf, rounds=41, eval_every=40, num_agents=10,
                       dataset="mnist", data_dir=str(mnist_dir), dtype="float64")
    records = {r["round"]: r for r in engine.run(config, write=False, progress=False).records}
    assert sorted(records) == [40, 41]
    error, violation = REFERENCE[algorithm]
    assert round(records[40 if algorithm == "objp" else 41]["test-error"], 4) == error
    assert f"{records[41]['consensus-violation']:.4g}" == f"{violation:.4g}"


def test_runs_are_functions_of_config_and_seed() -> None:
    base = papers(algorithm="objpm", epsilon=0.5, local_steps=2, rounds=3, num_agents=5)
    first = engine.run(base, write=False, progress=False)
    again = engine.run(base, write=False, progress=False)
    other = engine.run(dataclasses.replace(base, seed=1), write=False, progress=False)
    assert torch.equal(first.state.w, again.state.w)
    assert not torch.equal(first.state.w, other.state.w)
    assert [r["test-error"] for r in first.records] == [r["test-error"] for r in again.records]


def test_writes_config_and_metrics(tmp_path: Path) -> None:
    config = papers(algorithm="objt", epsilon=1.0, rounds=4, eval_every=2, out=str(tmp_path / "run"),
                       save_weights=True)
    result = engine.run(config, progress=False)
    assert result.directory == tmp_path / "run"
    records = read_metrics(result.directory)
    assert [r["round"] for r in records] == [2, 4]
    for r in records:
        expected = {"round", "test-error", "train-loss", "consensus-violation", "noise-magnitude", "rho"}
        assert expected <= r.keys()
        assert r["noise-magnitude"] > 0 and 0 <= r["test-error"] <= 1
    header = json.loads((result.directory / "config.json").read_text())
    assert header["algorithm"] == "objt" and header["engine"] == "batched"
    weights = np.load(result.directory / "weights.npz")
    assert sorted(weights.files) == ["round-2", "round-4"]
    np.testing.assert_array_equal(weights["round-4"], result.model.numpy())
    # a second run with the same out never overwrites the first
    second = engine.run(config, progress=False)
    assert second.directory == tmp_path / "run_1"
    assert len(read_metrics(tmp_path / "run")) == 2


@pytest.mark.parametrize("algorithm", ["objpm", "outp"])
def test_the_model_after_round_t_is_the_one_round_t_plus_1_sends(algorithm: str) -> None:
    """Round t's record and saved weights are the model after its releases: the w that round t + 1 sends."""
    config = papers(algorithm=algorithm, epsilon=0.5, rounds=2, num_agents=5,
                       rho_preset="custom", rho_tc=1)  # rho grows every round: rho^{t+1} is the one used
    two = engine.run(config, write=False, progress=False)
    three = engine.run(dataclasses.replace(config, rounds=3), write=False, progress=False)
    if algorithm == "outp":  # OutP computes w after its agents: the state's w is the model after the round
        assert torch.equal(two.model, two.state.w)
    else:  # the state's w is the one round 2 sent; round 3 sends the model after round 2
        assert not torch.equal(two.model, two.state.w)
        assert torch.equal(two.model, three.state.w)
    assert two.records[-1]["test-error"] == three.records[1]["test-error"]
    assert three.records[1]["test-error"] != three.records[2]["test-error"]


def test_private_runs_differ_from_non_private_and_learn() -> None:
    private = engine.run(papers(algorithm="objpm", epsilon=5.0, rounds=20, local_steps=3),
                         write=False, progress=False).records
    assert private[-1]["test-error"] < 0.5  # it learns on the embedded data
    assert all(r["noise-magnitude"] > 0 for r in private)


def test_budget_first_runs_calibrate_before_training_and_write_the_ledger(tmp_path: Path) -> None:
    config = papers(algorithm="objpm", local_steps=2, rounds=5, target_epsilon=3.0,
                       out=str(tmp_path / "r"))
    result = engine.run(config, progress=False)
    assert result.config.epsilon != config.epsilon and result.ledger is not None
    assert 2.9 < result.ledger.whole_run.epsilon_pld <= 3.0
    written = json.loads((result.directory / "privacy.json").read_text())
    assert written["whole_run"]["epsilon_pld"] == result.ledger.whole_run.epsilon_pld
    assert json.loads((result.directory / "config.json").read_text())["epsilon"] == result.config.epsilon


@pytest.mark.parametrize(("algorithm", "sensitivity"), [("objpm", "clipped"), ("objt", "data-dependent"),
                                                        ("outp", "clipped"), ("iadmm", "clipped")])
def test_seeds_batched_equal_separate_runs(algorithm: str, sensitivity: str) -> None:
    config = papers(algorithm=algorithm, epsilon=0.5, local_steps=2 if algorithm == "objpm" else 0,
                       rounds=3, num_agents=4, sensitivity=sensitivity)
    batched = engine.run_seeds(config, [3, 5, 8], write=False, progress=False)
    for seed, result in zip([3, 5, 8], batched, strict=True):
        alone = engine.run(dataclasses.replace(config, seed=seed), write=False, progress=False)
        assert result.config.seed == seed
        torch.testing.assert_close(result.state.w, alone.state.w, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(result.state.lam, alone.state.lam, rtol=1e-9, atol=1e-12)
        for ours, theirs in zip(result.records, alone.records, strict=True):
            for key in ("test-error", "consensus-violation", "noise-magnitude"):
                assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-15)
    if algorithm != "iadmm":
        assert not torch.equal(batched[0].state.w, batched[1].state.w)


def test_checkpointed_runs_resume_to_the_uninterrupted_result(tmp_path: Path) -> None:
    config = papers(algorithm="objpm", epsilon=1.0, local_steps=2, rounds=6, num_agents=4, eval_every=2)
    dirs = [tmp_path / "a" / "s1", tmp_path / "a" / "s2"]
    whole = engine.run_seeds(config, [1, 2], progress=False, directories=dirs,
                             checkpoint=tmp_path / "a" / "ckpt.pt")
    # interrupted after round 4: a checkpoint of round 4, then more rounds lost
    short = dataclasses.replace(config, rounds=4)
    part_dirs = [tmp_path / "b" / "s1", tmp_path / "b" / "s2"]
    engine.run_seeds(short, [1, 2], progress=False, directories=part_dirs,
                     checkpoint=tmp_path / "b" / "ckpt.pt")
    saved = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)
    # the same run, stopped at round 4, by a version without the partition keys: it ran with their defaults
    newer = ("partition", "partition-seed")
    saved["config"] = {k: v for k, v in config.to_mapping().items() if k not in newer}
    torch.save(saved, tmp_path / "b" / "ckpt.pt")
    with open(part_dirs[0] / "metrics.jsonl", "a") as fh:  # a record past the checkpoint
        fh.write(json.dumps({"round": 5, "test-error": 1.0}) + "\n")
    resumed = engine.run_seeds(config, [1, 2], progress=False, directories=part_dirs,
                               checkpoint=tmp_path / "b" / "ckpt.pt")
    for a, b, d in zip(whole, resumed, part_dirs, strict=True):
        assert torch.equal(a.state.w, b.state.w)
        assert [r["round"] for r in read_metrics(d)] == [2, 4, 6]
        assert read_metrics(d)[-1]["test-error"] == a.records[-1]["test-error"]
    for other in ({"epsilon": 2.0}, {"partition": "shards:1"}):
        with pytest.raises(ValueError, match="belongs to another run"):
            engine.run_seeds(dataclasses.replace(config, **other), [1, 2], progress=False,
                             directories=part_dirs, checkpoint=tmp_path / "b" / "ckpt.pt")


def test_partial_participation_keeps_the_state_of_agents_not_sampled() -> None:
    config = papers(algorithm="objpm", local_steps=2, epsilon=0.5, num_agents=5, rounds=3,
                       fraction_train=0.6, seed=2)
    dataset = load_for(config)
    data = agent_data(dataset, config, range(config.num_agents))
    zeros = torch.zeros((1, 5, *data.shape), dtype=torch.float64)
    state = engine.EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(),
                               lam=zeros.clone())
    full = engine.EngineState(**{k: v.clone() for k, v in vars(state).items()})
    for t in (1, 2):
        before = engine.EngineState(**{k: v.clone() for k, v in vars(state).items()})
        engine.step(config, data, state, t)
        engine.step(dataclasses.replace(config, fraction_train=1.0), data, full, t)
        sampled = schedules.participants(config, t)
        for p in range(5):
            for key in ("z", "z_chain", "lam"):
                same = torch.equal(getattr(state, key)[0, p], getattr(before, key)[0, p])
                assert same == (p not in sampled), (t, p, key)
        # w averages all P agents, sampled or not (eq. (4a))
        assert torch.allclose(state.w, (before.z - before.lam / schedules.rho_at(config, t)).mean(dim=1))
    assert not torch.allclose(state.w, full.w)  # partial participation changes the run
    first = engine.run(config, write=False, progress=False)
    again = engine.run(config, write=False, progress=False)
    assert torch.equal(first.state.w, again.state.w)  # and it is still a function of config and seed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("algorithm", ["objpm", "objt"])
def test_cpu_and_cuda_give_the_same_w(algorithm: str) -> None:
    """Several rounds on CPU (fused C kernels) and on CUDA (compiled noise, cuBLAS products): the noise is
    the same bits, so w differs only by the products' rounding."""
    config = papers(algorithm=algorithm, epsilon=1.0, local_steps=3, rounds=6, eval_every=6, num_agents=10)
    cpu = engine.run(config, write=False, progress=False)
    cuda = engine.run(dataclasses.replace(config, device="cuda"), write=False, progress=False)
    torch.testing.assert_close(cuda.state.w.cpu(), cpu.state.w, rtol=1e-9, atol=1e-12)
    assert cuda.records[-1]["noise-magnitude"] == pytest.approx(cpu.records[-1]["noise-magnitude"], rel=1e-12)


@pytest.mark.parametrize(("model", "classes"), [("logistic", 10), ("mlp", 0)])
def test_the_step_rule_reads_logistic_regressions_classes_from_its_weights(monkeypatch: pytest.MonkeyPatch,
                                                                           model: str, classes: int) -> None:
    """The room sqrt(P K) of logistic regression takes K from the columns of its [F, K] weights (the
    embedded data's 10 classes); a network's room reads no K (0)."""
    seen: list[int] = []
    real = schedules.local_eta

    def recording(config: RunConfig, t: int, noise_scale: torch.Tensor | None, num_params: int,
                  classes: int) -> float:
        seen.append(classes)
        return real(config, t, noise_scale, num_params, classes)

    monkeypatch.setattr(schedules, "local_eta", recording)
    config = dataclasses.replace(main_job(), model=model, num_agents=5, rounds=1, target_epsilon=8.0,
                                 dtype="float32")
    engine.run(config, write=False, progress=False)
    assert seen and set(seen) == {classes}
