"""Every key of an ADMM-sharing run (paper 001, Hu et al., eqs. (5)-(8) and (16)), validated.

The keys are the run-config keys of the Flower app and the flags of ``dpadmm train``, as for every
family (:mod:`dpadmm.keys`). The paper prints none of its hyper-parameters; the defaults are the
project's, stated in each field's help.

The objective is (1/N) sum_i log(1 + exp(-Y_i z_i)) + l2 sum_m ||x_m||^2 / 2 with z = sum_m D_m x_m:
the mean loss (the paper's OCR leaves the 1/N open) and R_m = ||x_m||^2 / 2, so that it equals
scikit-learn's ``LogisticRegression(C = 1 / (N l2), fit_intercept=False)``, whose objective is
N times this one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpadmm import keys
from dpadmm.keys import allowed

ALGORITHMS = ("admm-sharing",)
NOISE_MODES = ("message", "paper")
DATASETS = ("a9a", "mnist-4v9")
DEVICES = ("cpu", "cuda")
DTYPES = ("float64", "float32")
_RUN = keys.run_fields("rounds")
_FLOWER = keys.flower_fields("party", "parties' messages of a round")


def parse_parties(text: str) -> tuple[int, ...]:
    """The column-block widths of ``parties`` ("66,57"): positive integers, at least one."""
    try:
        widths = tuple(int(w) for w in str(text).split(","))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise ValueError(f"parties={text!r} is not allowed; give comma-separated positive column counts, "
                         "one per party, e.g. '66,57'")
    return widths


@dataclass(frozen=True)
class SharingConfig(keys.Keyed):
    """A run of 001's ADMM sharing with logistic loss on a vertical split of one data set."""

    algorithm: str = field(default="admm-sharing",
                           metadata={"help": "admm-sharing (001 Algorithm 1; eq. (16) with noise)"})
    epsilon: float = field(
        default=1.0,
        metadata={"help": "epsilon of one round of one party (Theorem 3: (epsilon, delta)-DP per round, "
                          "epsilon <= 1); inf = non-private"},
    )
    delta: float = field(default=1e-5, metadata={"help": "delta of one round of one party"})
    delta_prime: float = field(
        default=1e-5,
        metadata={"help": "delta' of advanced composition over the rounds (Corollary 1, eq. (17))"},
    )
    noise: str = field(
        default="message",
        metadata={"help": "message (N(0, sigma^2 I_N) on the N-vector a party sends: the Gaussian mechanism "
                          "as stated) or paper (N(0, sigma^2 (D_m^T D_m)^-1) on x_m, eq. (16): its message "
                          "noise lies in the column space of D_m only, NOT covered)"},
    )
    x_bound: float = field(
        default=10.0,
        metadata={"help": "b: every x_m is kept in the ball ||x_m|| <= b (the set X_m of eq. (6)); with rows "
                          "of unit norm each entry of a message is then in [-b, b], and the sensitivity is "
                          "2 b sqrt(N)"},
    )
    rounds: int = field(default=50, metadata={"help": "rounds T (one x-, z- and y-update each)"})
    rho: float = field(
        default=0.0,
        metadata={"help": "penalty rho of the augmented Lagrangian, eq. (5); 0 = 1/(2N), twice the "
                          "Lipschitz constant 1/(4N) of the mean loss's gradient (001's Assumption 1.2 needs "
                          "rho >= it)"},
    )
    l2: float = field(default=1e-4, metadata={"help": "lambda of the regulariser lambda sum_m ||x_m||^2 / 2"})
    dataset: str = field(default="a9a", metadata={"help": "a9a or mnist-4v9 (MNIST digits 4 against 9, "
                                                          "the stand-in for gisette)"})
    data_dir: str = field(default="", metadata={"help": "folder with the data set's files; empty: the cache, "
                                                        "fetched on first use"})
    parties: str = field(
        default="66,57",
        metadata={"help": "comma-separated column counts of the parties' contiguous feature blocks, in "
                          "order (001's a9a split: 66,57)"},
    )
    labels_path: str = field(
        default="",
        metadata={"help": "the Flower server's labels file in a deployment: an .npz with ids [N], y [N] "
                          "(0/1), test_ids and y_test, whose ids every party's file lists in the same order "
                          "(checked each round); empty = the labels of dataset (simulation, and dpadmm "
                          "train, which refuses a labels-path)"},
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
        allowed("noise", self.noise, NOISE_MODES)
        allowed("dataset", self.dataset, DATASETS)
        allowed("device", self.device, DEVICES)
        allowed("dtype", self.dtype, DTYPES)
        parse_parties(self.parties)
        if not (0 < self.epsilon <= 1 or self.epsilon == math.inf):
            raise ValueError(f"epsilon={self.epsilon!r} is not allowed; Theorem 3 of 001 needs "
                             "0 < epsilon <= 1 per round (inf = non-private)")
        keys.require(self, "in (0, 1)", "delta", "delta_prime")
        keys.require(self, "finite and > 0", "x_bound", "l2")
        keys.require(self, "> 0", "node_timeout", "round_timeout")
        if not 0 <= self.rho < math.inf:
            raise ValueError(f"rho={self.rho!r} is not allowed; it must be finite and >= 0 (0 = 1/(2N))")
        keys.require(self, ">= 1", "rounds", "eval_every")
        keys.require_seed(self.seed)

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def widths(self) -> tuple[int, ...]:
        return parse_parties(self.parties)

    def penalty(self, num_samples: int) -> float:
        """rho, with 0 resolved to 1/(2N)."""
        return self.rho or 1 / (2 * num_samples)

    def default_out(self) -> str:
        """runs/<algorithm>-<data>-<privacy>-seed<seed>: the run is given (eps, delta) per round of one party
        (Theorem 3), so the folder says per round; the whole run's figure is the ledger's."""
        label = f"eps{self.epsilon:g}-delta{self.delta:g}-per-round" if self.private else "epsinf"
        return f"runs/{self.algorithm}-{self.dataset}-{label}-seed{self.seed}"
