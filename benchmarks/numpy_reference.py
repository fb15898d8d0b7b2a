"""A plain NumPy DP-IADMM (ObjP / ObjPM, logistic regression): the yardstick of the engine's speed.

The authors' equations written the way one would write them first, one agent after the other
with NumPy's matrix products and generator, and nothing else: no batching over agents, no
fused kernels, no keyed streams. ``benchmarks.speed`` times it side by side with the engine
on the same data and configuration, and ``tests/test_numpy_reference.py`` checks that it
computes what the engine computes (the same w without noise).

Per round t (003 Algorithm 1, with 003 Appendix G's model):

- w = (1/P) sum_p (z_p - lambda_p / rho)                               eq. (4a), line 5
- per agent p, E local steps from z_p's last iterate:
  - H = softmax(X_p z), R = H - Y_p                                     eq. (63)
  - per-sample clipping of x_i r_i^T to L1 norm C (||x_i||_1 ||r_i||_1), Delta = 2C/I
  - g = X_p^T R / I + 2 (beta / P) z                                    grad f_p, eq. (63)
  - xi ~ Laplace(Delta / eps)^{J x K}                                   eq. (9a)
  - z = (z / eta + rho w + lambda_p - xi - g) / (1/eta + rho)            eq. (8)
  - z_p is the average of the E iterates                               line 21
- lambda_p = lambda_p + rho (w - z_p)                                  eq. (4c), line 23

A module, not a script: ``python -m benchmarks.numpy_reference`` only says where it is used.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from benchmarks import ArgumentParser


@dataclass(frozen=True)
class ReferenceConfig:
    """The constants of one run: eq. (24)'s rho^t, eta^t = a / sqrt(t), beta, the clip norm, epsilon."""

    epsilon: float  # math.inf: no noise (IADMM)
    rho_c1: float
    rho_c2: float
    rho_tc: int
    prox_scale: float = 1.0
    beta: float = 1e-6
    clip_norm: float = 200.0
    local_steps: int = 1
    seed: int = 0


def _rho(config: ReferenceConfig, t: int) -> float:
    """rho^t = min(1e9, c1 1.2^floor(t / Tc) + c2 / eps), eq. (24) of 003."""
    extra = 0.0 if math.isinf(config.epsilon) else config.rho_c2 / config.epsilon
    return min(1e9, config.rho_c1 * 1.2 ** (t // config.rho_tc) + extra)


class NumpyDPIADMM:
    """The agents' data as lists of NumPy blocks, and the state z_p, lambda_p, w."""

    def __init__(self, xs: list[np.ndarray], labels: list[np.ndarray], num_classes: int,
                 config: ReferenceConfig, total: int | None = None):
        self.config = config
        self.xs = xs
        self.ys = [np.eye(num_classes)[lab] for lab in labels]
        self.x_l1 = [np.abs(x).sum(axis=1) for x in xs]
        self.total = sum(x.shape[0] for x in xs) if total is None else total  # I of eq. (63), public
        shape = (xs[0].shape[1], num_classes)
        self.w = np.zeros(shape)
        self.z = [np.zeros(shape) for _ in xs]
        self.z_last = [np.zeros(shape) for _ in xs]
        self.lam = [np.zeros(shape) for _ in xs]
        self.rng = np.random.default_rng(config.seed)

    def gradient(self, p: int, z: np.ndarray) -> np.ndarray:
        """(1/I) sum_i clip(x_i (h_i - y_i)^T) + 2 (beta / P) z for agent p."""
        logits = self.xs[p] @ z
        logits -= logits.max(axis=1, keepdims=True)
        h = np.exp(logits)
        h /= h.sum(axis=1, keepdims=True)
        r = h - self.ys[p]
        if math.isfinite(self.config.epsilon):
            norms = self.x_l1[p] * np.abs(r).sum(axis=1)
            with np.errstate(divide="ignore"):
                r *= np.minimum(1.0, self.config.clip_norm / norms)[:, None]
        return self.xs[p].T @ r / self.total + 2.0 * self.config.beta / len(self.xs) * z

    def round(self, t: int) -> None:
        """Round t of Algorithm 1 for every agent, in place."""
        config = self.config
        rho = _rho(config, t)
        eta = config.prox_scale / math.sqrt(t)
        self.w = sum(z - lam / rho for z, lam in zip(self.z, self.lam, strict=True)) / len(self.z)
        scale = 2.0 * config.clip_norm / self.total / config.epsilon
        for p in range(len(self.xs)):
            z, total = self.z_last[p], np.zeros_like(self.w)
            for _ in range(config.local_steps):
                g = self.gradient(p, z)
                if math.isfinite(config.epsilon):
                    g = g + self.rng.laplace(0.0, scale, size=z.shape)
                z = (z / eta + rho * self.w + self.lam[p] - g) / (1.0 / eta + rho)
                total += z
            self.z_last[p], self.z[p] = z, total / config.local_steps
            self.lam[p] = self.lam[p] + rho * (self.w - self.z[p])


def main(argv: list[str] | None = None) -> int:
    """Say where the reference is used (``python -m benchmarks.numpy_reference``): it times nothing itself."""
    parser = ArgumentParser(prog="python -m benchmarks.numpy_reference", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    print("benchmarks.numpy_reference is a module, not a script: `python -m benchmarks.speed` times it "
          "beside the engine, and tests/test_numpy_reference.py checks it against the engine",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
