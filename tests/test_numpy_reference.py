"""benchmarks.numpy_reference, the yardstick of benchmarks.speed: it computes what the engine computes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.numpy_reference import NumpyDPIADMM, ReferenceConfig
from dpadmm.iadmm import engine
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.federation import load_for


@pytest.mark.parametrize(("algorithm", "steps"), [("objp", 1), ("objpm", 3)])
def test_reference_equals_the_engine_without_noise(algorithm: str, steps: int) -> None:
    config = papers(algorithm=algorithm, epsilon=math.inf, local_steps=steps, rounds=4, eval_every=4)
    dataset = load_for(config)
    blocks = dataset.partition(config.num_agents)
    c1, c2, tc = config.rho_constants
    reference = NumpyDPIADMM([dataset.x_train[b].numpy() for b in blocks],
                             [dataset.y_train[b].numpy() for b in blocks], dataset.num_classes,
                             ReferenceConfig(epsilon=math.inf, rho_c1=c1, rho_c2=c2, rho_tc=tc,
                                             local_steps=steps))
    for t in range(1, config.rounds + 1):
        reference.round(t)
    ours = engine.run(config, dataset=dataset, write=False, progress=False).state.w.numpy()
    np.testing.assert_allclose(reference.w, ours, rtol=1e-10, atol=1e-13)
    assert np.abs(ours).max() > 1e-4  # it moved


def test_reference_noise_has_the_clipped_laplace_scale() -> None:
    """A private round moves z_p by -xi / (1/eta + rho) from the noiseless one (the clip norm does not bind
    here), with mean |xi| = Delta / eps = 2C / (I eps)."""
    config = papers(algorithm="objp", epsilon=0.5, rounds=1)
    dataset = load_for(config)
    blocks = dataset.partition(config.num_agents)
    xs, ys = [dataset.x_train[b].numpy() for b in blocks], [dataset.y_train[b].numpy() for b in blocks]
    runs = {eps: NumpyDPIADMM(xs, ys, 10, ReferenceConfig(epsilon=eps, rho_c1=2.0, rho_c2=0.0, rho_tc=10**4))
            for eps in (0.5, math.inf)}
    for run in runs.values():
        run.round(1)
    rho, eta = 2.0, 1.0  # rho^1 = c1 without the c2 term, eta^1 = a / sqrt(1)
    moved = np.concatenate([(a - b).ravel() for a, b in zip(runs[0.5].z, runs[math.inf].z, strict=True)])
    scale = 2 * 200.0 / dataset.num_train / 0.5
    assert np.mean(np.abs(moved)) * (1 / eta + rho) == pytest.approx(scale, rel=0.03)
