"""The engine with a module model: equal to the logistic fast path, to the loop over agents, and resumed.

On a 600-image slice of the embedded MNIST sample (10 agents of 60), average-pooled to 7 x 7
(49 features), so each run takes a second or two: the module path computes and holds
per-sample gradients (the MLP's are 3,850 numbers per image here, 50,890 at 28 x 28).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.data import Dataset, load_dataset
from dpadmm.iadmm import engine
from dpadmm.iadmm.config import main_job, papers
from dpadmm.models.modules import LogisticRegression
from dpadmm.runs.results import read_metrics


@pytest.fixture(scope="module")
def small() -> Dataset:
    """The first 600 training and 200 test images of the embedded data set, pooled to 7 x 7."""
    full = load_dataset("default")

    def pooled(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(x.reshape(-1, 1, 28, 28), 4).flatten(1)

    return Dataset(name="default", x_train=pooled(full.x_train[:600]), y_train=full.y_train[:600].clone(),
                   x_test=pooled(full.x_test[:200]), y_test=full.y_test[:200].clone(),
                   num_classes=full.num_classes)


@pytest.mark.parametrize("values", [
    {"algorithm": "objpm", "local_steps": 3},
    {"algorithm": "objt"},
    {"algorithm": "objpm", "local_steps": 2, "mechanism": "gaussian"},
    {"algorithm": "objpm", "local_steps": 2, "fraction_train": 0.5},
    {"algorithm": "iadmm", "local_steps": 2},
    {"algorithm": "objpm", "local_steps": 2, "mechanism": "gaussian", "local_start": "global",
     "release": "last", "server_update": "mean", "fraction_train": 0.5},
], ids=["objpm", "objt", "gaussian", "fraction-train", "iadmm", "fedavg-shaped"])
def test_logistic_regression_module_equals_the_fast_path(values: dict, small: Dataset) -> None:
    """The generic path (torch.func per-sample gradients, clipping by their norm, the noise drawn as one
    flat vector per agent) reproduces the closed-form one: the same w after 5 rounds, float64."""
    config = papers(epsilon=0.5, rounds=5, **values)
    fast = engine.run(config, dataset=small, write=False, progress=False)
    generic = engine.run(dataclasses.replace(config, model="custom"), dataset=small, write=False,
                         progress=False, module=LogisticRegression(small.num_features, small.num_classes))
    assert list(generic.state.w) == ["weight"]
    assert float(fast.state.w.abs().max()) > 1e-3  # the runs moved
    torch.testing.assert_close(generic.state.w["weight"], fast.state.w, rtol=0, atol=1e-12)
    torch.testing.assert_close(generic.state.lam["weight"], fast.state.lam, rtol=0, atol=1e-12)
    for ours, theirs in zip(generic.records, fast.records, strict=True):
        for key in ("test-error", "train-loss", "consensus-violation", "noise-magnitude"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-10, abs=1e-14), key


@pytest.mark.parametrize("server_update", ["admm", "mean"])
def test_the_loop_over_agents_equals_vmap_for_an_mlp(server_update: str, small: Dataset,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """vectorize=False (one agent after the other) and agent chunks of 3 give vmap's numbers (with
    server-update=mean the duals wait for the last chunk: they are updated against every agent's release)."""
    config = papers(algorithm="objpm", local_steps=2, epsilon=1.0, rounds=2, model="mlp", clip_norm=5.0,
                    server_update=server_update)
    batched = engine.run(config, dataset=small, write=False, progress=False)
    looped = engine.run(config, dataset=small, write=False, progress=False, vectorize=False)
    size = sum(v.numel() for v in batched.state.w.values())
    monkeypatch.setattr(engine, "AGENT_CHUNK_BUDGET", 3 * size)  # 10 agents in chunks of 3, 3, 3, 1
    chunked = engine.run(config, dataset=small, write=False, progress=False)
    assert list(batched.state.w) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    for other in (looped, chunked):
        for key in ("w", "z", "lam"):
            ours, theirs = getattr(batched.state, key), getattr(other.state, key)
            for name in ours:
                torch.testing.assert_close(theirs[name], ours[name], rtol=1e-10, atol=1e-13)
        assert other.records[-1]["test-error"] == batched.records[-1]["test-error"]
    assert batched.records[-1]["noise-magnitude"] > 0


def test_a_module_run_of_one_seed_draws_from_that_seed(small: Dataset) -> None:
    """run_seeds(config, [s]) is the run of seed s whatever config.seed says, for a module as for logistic
    regression (a module's draws are keyed by its configuration's seed)."""
    config = papers(algorithm="objpm", epsilon=1.0, local_steps=2, rounds=2, model="mlp")
    given = engine.run_seeds(config, [7], dataset=small, write=False, progress=False)[0]
    own = engine.run_seeds(dataclasses.replace(config, seed=7), [7], dataset=small, write=False,
                           progress=False)[0]
    other = engine.run_seeds(config, [0], dataset=small, write=False, progress=False)[0]
    assert given.config.seed == 7
    for name, value in own.state.w.items():
        assert torch.equal(given.state.w[name], value), name
    assert not torch.equal(given.state.w["fc1.weight"], other.state.w["fc1.weight"])


def test_a_resumed_module_run_equals_the_uninterrupted_one(tmp_path: Path, small: Dataset) -> None:
    """Two seeds of an MLP run one after the other, each with its own checkpoint file."""
    config = papers(algorithm="objpm", epsilon=1.0, local_steps=2, rounds=4, eval_every=2, model="mlp")
    dirs = [tmp_path / "a" / "s1", tmp_path / "a" / "s2"]
    whole = engine.run_seeds(config, [1, 2], dataset=small, progress=False, directories=dirs,
                             checkpoint=tmp_path / "a" / "ckpt.pt")
    short = dataclasses.replace(config, rounds=2)
    part_dirs = [tmp_path / "b" / "s1", tmp_path / "b" / "s2"]
    engine.run_seeds(short, [1, 2], dataset=small, progress=False, directories=part_dirs,
                     checkpoint=tmp_path / "b" / "ckpt.pt")
    for seed in (1, 2):  # the same runs, stopped after round 2
        path = tmp_path / "b" / f"ckpt.pt.seed-{seed}"
        saved = torch.load(path, weights_only=True)
        assert saved["round"] == 2 and isinstance(saved["w"], dict)
        saved["config"] = dataclasses.replace(config, seed=seed).to_mapping()
        torch.save(saved, path)
    resumed = engine.run_seeds(config, [1, 2], dataset=small, progress=False, directories=part_dirs,
                               checkpoint=tmp_path / "b" / "ckpt.pt")
    assert not torch.equal(whole[0].state.w["fc1.weight"], whole[1].state.w["fc1.weight"])
    for a, b, d in zip(whole, resumed, part_dirs, strict=True):
        for key in ("w", "z", "z_chain", "lam"):
            for name, value in getattr(a.state, key).items():
                assert torch.equal(getattr(b.state, key)[name], value), (key, name)
        assert [r["round"] for r in read_metrics(d)] == [2, 4]
        assert read_metrics(d)[-1]["test-error"] == a.records[-1]["test-error"]


def test_save_weights_names_each_parameter_of_a_module(tmp_path: Path, small: Dataset) -> None:
    config = papers(algorithm="objp", epsilon=1.0, rounds=2, model="mlp", save_weights=True,
                       out=str(tmp_path / "run"))
    result = engine.run(config, dataset=small, progress=False)
    weights = np.load(result.directory / "weights.npz")
    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert sorted(weights.files) == sorted(f"round-{t}.{name}" for t in (1, 2) for name in names)
    for name in names:
        np.testing.assert_array_equal(weights[f"round-2.{name}"], result.model[name].numpy())
    assert weights["round-1.fc1.weight"].shape == (64, 49)
    assert not np.array_equal(weights["round-1.fc1.weight"], weights["round-2.fc1.weight"])


@pytest.mark.slow
def test_the_main_job_trains_an_mlp_without_a_search() -> None:
    """The main job (eps = 8 for the whole run) with model=mlp: its rule for a and rho (RunConfig.scale)
    takes the network well below the untrained loss ln 10 in 10 rounds, in float32 too (the family page's
    float64 figures are test_docs's); the papers' logistic-regression constants left it near chance."""
    config = dataclasses.replace(main_job(), model="mlp", dtype="float32")
    records = engine.run(config, write=False, progress=False).records
    assert records[-1]["test-error"] < 0.25
    assert records[-1]["train-loss"] < 0.6 * np.log(10)


@pytest.mark.slow
def test_the_main_jobs_small_cnn_learns_without_noise() -> None:
    """The same steps as a private run's, without their noise: clipped at C (RunConfig.clipped), since the
    rule's rate is in units of 1 / C. Unclipped, the first step sent the small CNN to chance for the whole
    run (test error 0.90 after each of 10 rounds)."""
    config = dataclasses.replace(main_job(), model="small-cnn", dtype="float32", epsilon=math.inf,
                                 target_epsilon=0.0, rounds=3, eval_every=3)
    record = engine.run(config, write=False, progress=False).records[-1]
    assert record["test-error"] < 0.3
    assert record["train-loss"] < 0.5 * np.log(10)
