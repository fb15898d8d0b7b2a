"""Every key of a DP-ADMM / DP-AccADMM run (paper 002, Xu et al., Algorithms 2 and 3), validated.

The keys are the run-config keys of the Flower app and the flags of ``dpadmm train``, as for
every family (:mod:`dpadmm.keys`). Where the paper states a setting it is the default
(delta = 1e-3, mu = 0.5, rho = 1, gamma = 1, lambda = 1e-5); where it does not (T, eta, x_0,
the graph), the default is the project's choice, documented in the field's help and in
``docs/results/002/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpadmm import keys
from dpadmm.catalog import BINARY_DATASET_NAMES
from dpadmm.keys import allowed
from dpadmm.privacy.device import NEIGHBOURING

ALGORITHMS = ("dp-admm", "dp-accadmm")
DUAL_INITS = ("zero", "paper")
RESTARTS = ("none", "goldstein")
DEVICES = ("cpu", "cuda")
DTYPES = ("float64", "float32")
_RUN = keys.run_fields("iterations")
_FLOWER = keys.flower_fields("client", "gradients of an iteration")


@dataclass(frozen=True)
class LinAdmmConfig(keys.Keyed):
    """A run of 002's linearised ADMM on the graph-guided fused lasso with logistic loss (eq. (11))."""

    algorithm: str = field(
        default="dp-admm",
        metadata={"help": "dp-admm (002 Algorithm 2) or dp-accadmm (Algorithm 3, Nesterov-accelerated); "
                          "with target-epsilon=inf, their non-private counterparts ADMM and AccADMM"},
    )
    target_epsilon: float = field(
        default=0.05,
        metadata={"help": "the whole-run epsilon at delta that Theorem 1 (eq. (8)) calibrates the Gaussian "
                          "noise for; inf = non-private"},
    )
    delta: float = field(default=1e-3, metadata={"help": "delta of the whole-run guarantee (paper: 1e-3)"})
    rdp_mu: float = field(
        default=0.5,
        metadata={"help": "mu of Theorem 1: the share of epsilon spent on the RDP of the T releases, the "
                          "rest on converting RDP to (eps, delta) (paper: 0.5)"},
    )
    rounds: int = field(default=200, metadata={"help": "iterations T (one noisy full-batch gradient each)"})
    eta: float = field(
        default=1.0,
        metadata={"help": "step size eta of the linearised x-step (eq. (7)); the paper tunes it per data set "
                          "and does not print it"},
    )
    gamma: float = field(
        default=1.0,
        metadata={"help": "gamma of G = gamma I - eta rho A^T A (paper: 1); 0 = the theory's gamma_min = "
                          "eta rho ||A^T A||_2 + 1"},
    )
    rho: float = field(default=1.0, metadata={"help": "penalty rho of the augmented Lagrangian (paper: 1)"})
    l1: float = field(default=1e-5, metadata={"help": "lambda of the fused-lasso penalty lambda ||A x||_1 "
                                                      "(paper, Table I: 1e-5)"})
    graph_alpha: float = field(
        default=0.3,
        metadata={"help": "regularisation of the sparse inverse-covariance selection (scikit-learn's "
                          "GraphicalLasso on the standardised training features) whose edges give W"},
    )
    grad_bound: float = field(
        default=1.0,
        metadata={"help": "c: each per-sample gradient is clipped to L2 norm c (with rows of unit norm the "
                          "logistic gradient is already below 1)"},
    )
    neighbouring: str = field(
        default="add-remove",
        metadata={"help": "add-remove (one sample added or removed: sensitivity c/n, the paper's) or "
                          "replace-one (2c/n)"},
    )
    restart: str = field(
        default="none",
        metadata={"help": "dp-accadmm only: none (002's Algorithm 3, which never restarts and need not "
                          "converge) or goldstein (restart the momentum when the combined residual stops "
                          "falling, Goldstein et al. 2014, Algorithm 8)"},
    )
    dual_init: str = field(
        default="zero",
        metadata={"help": "u_0: zero (private) or paper (-(1/rho) pinv(A^T) grad f(x_0), an un-noised "
                          "gradient: NOT covered by the guarantee)"},
    )
    dataset: str = field(
        default="a9a",
        metadata={"help": f"one of {', '.join(BINARY_DATASET_NAMES)} (002's Table I)"},
    )
    data_dir: str = field(default="", metadata={"help": "folder with the data set's files; empty: the cache, "
                                                        "fetched on first use"})
    num_agents: int = field(
        default=1,
        metadata={"help": "clients holding contiguous blocks of the training rows (Flower); the mathematics "
                          "does not depend on it: the server sums their gradients"},
    )
    seed: int = _RUN["seed"]
    device: str = _RUN["device"]
    dtype: str = _RUN["dtype"]
    eval_every: int = _RUN["eval_every"]
    out: str = _RUN["out"]
    node_timeout: float = _FLOWER["node_timeout"]
    round_timeout: float = _FLOWER["round_timeout"]

    def __post_init__(self) -> None:
        self.check_types()
        allowed("algorithm", self.algorithm, ALGORITHMS)
        allowed("dataset", self.dataset, BINARY_DATASET_NAMES)
        allowed("neighbouring", self.neighbouring, NEIGHBOURING)
        allowed("dual-init", self.dual_init, DUAL_INITS)
        allowed("restart", self.restart, RESTARTS)
        if self.restart != "none" and self.algorithm != "dp-accadmm":
            raise ValueError(f"restart={self.restart!r} is not allowed with algorithm={self.algorithm!r}: it "
                             "restarts AccADMM's momentum; use algorithm='dp-accadmm' or restart='none'")
        allowed("device", self.device, DEVICES)
        allowed("dtype", self.dtype, DTYPES)
        if math.isnan(self.target_epsilon) or self.target_epsilon <= 0:
            raise ValueError(f"target-epsilon={self.target_epsilon!r} is not allowed; it must be > 0 "
                             "(inf = non-private)")
        keys.require(self, "in (0, 1)", "delta", "rdp_mu")
        keys.require(self, "finite and > 0", "eta", "rho", "graph_alpha", "grad_bound")
        keys.require(self, "> 0", "node_timeout", "round_timeout")
        keys.require(self, "finite and >= 0", "gamma", "l1")  # gamma 0 = gamma_min
        keys.require(self, ">= 1", "rounds", "num_agents", "eval_every")
        keys.require_seed(self.seed)

    @property
    def private(self) -> bool:
        return math.isfinite(self.target_epsilon)

    @property
    def accelerated(self) -> bool:
        return self.algorithm == "dp-accadmm"

    def default_out(self) -> str:
        """runs/<algorithm>-<data>-<privacy>-seed<seed>, named after the whole-run (eps, delta)."""
        label = f"eps{self.target_epsilon:g}-delta{self.delta:g}" if self.private else "epsinf"
        return f"runs/{self.algorithm}-{self.dataset}-{label}-seed{self.seed}"
