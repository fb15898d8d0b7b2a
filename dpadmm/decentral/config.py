"""Every key of a decentralised local-DP run (paper 004, Xiao, Ye & Devadas), validated.

The defaults are the paper's Example (a) (Sec. 5): UCI Adult, N = 10 agents on a random graph with
|E| = 20 edges, 100 samples per agent, Algorithm 1 with D = 10 and zeta = 0.5, Laplace noise of rate
beta_k = 1.02^k, K = 100 iterations; but B_inf defaults to 2/b_i = 0.02, the bound that holds, where
the paper takes 0.01. What the paper leaves open (the dual update's sign, the labels, general graphs, the
indices of its sums) is the project's choice, and each field's help says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpadmm import keys
from dpadmm.data.partition import check_equal_sizes, parse_scheme
from dpadmm.keys import allowed

# ldp-admm: Algorithm 1 (random-penalty linearised ADMM); ldp-dgd: Algorithm 2 (complete graph);
# ldp-dgd-star: Algorithm 2* (any graph); dgd: noisy decentralised gradient descent, the baseline [45]
ALGORITHMS = ("ldp-admm", "ldp-dgd", "ldp-dgd-star", "dgd")
WEIGHTS = ("random", "fixed")
X_STEPS = ("linearised", "exact")
GRAPHS = ("random", "complete")
NOISES = ("laplace", "none")
EXCHANGES = ("plain", "secret")
DATASETS = ("adult",)
DEVICES = ("cpu", "cuda")
DTYPES = ("float64", "float32")
_RUN = keys.run_fields("iterations")
_FLOWER = keys.flower_fields("agent", "agents' iterates of an iteration")


@dataclass(frozen=True)
class DecentralConfig(keys.Keyed):
    """A run of one of 004's algorithms: agents on a graph, each with its own samples, no server."""

    algorithm: str = field(
        default="ldp-admm",
        metadata={"help": "ldp-admm (Algorithm 1), ldp-dgd (Algorithm 2, complete graph), ldp-dgd-star "
                          "(Algorithm 2*), dgd (noisy decentralised gradient descent, the baseline [45])"},
    )
    weights: str = field(
        default="random",
        metadata={"help": "random (each agent draws its aggregation weights w ~ U(0, 1) per coordinate and "
                          "iteration, the paper's random local aggregator) or fixed (w = 1/2: the "
                          "fixed-parameter counterpart, Gamma = D/2, rho = D/(2|N_i|))"},
    )
    x_step: str = field(
        default="linearised",
        metadata={"help": "linearised (Algorithm 1: f_i replaced by its gradient at x_i^k, a closed form) or "
                          "exact (eq. (12): the argmin with f_i itself, by Newton's method; ldp-admm "
                          "without noise, as the paper's Example (d))"},
    )
    graph: str = field(default="random", metadata={
        "help": "random (connected, `edges` edges, a new graph per seed) or complete"})
    agents: int = field(default=10, metadata={"help": "N, the number of agents"})
    edges: int = field(default=20, metadata={"help": "|E| of a random graph (N - 1 .. N(N - 1)/2)"})
    samples: int = field(default=100, metadata={"help": "b_i, the training samples each agent draws"})
    partition: str = field(
        default="contiguous",
        metadata={"help": "how the N b drawn rows are dealt (public): contiguous (agent i the i-th b, the "
                          "paper's IID agents), dirichlet:ALPHA (label skew, b each: 0.1 strong, 1000 "
                          "near-IID) or shards:K (K label-sorted shards of b/K each)"},
    )
    penalty: float = field(default=10.0, metadata={"help": "D of Algorithm 1 (the paper: 10); alpha_k = 1/D"})
    zeta: float = field(default=0.5, metadata={"help": "zeta, the dual step of Algorithm 1 (the paper: 0.5)"})
    step_decay: float = field(
        default=0.93,
        metadata={"help": "eta_k = step-decay^k, the step of Algorithms 2, 2* and dgd (the paper: 0.95 for "
                          "Algorithm 2 without noise, 0.93 for 2*, 0.9 for [45]); alpha_k = eta_k"},
    )
    exchange: str = field(
        default="plain",
        metadata={"help": "plain (each agent sends its iterate to its neighbours) or secret (Algorithm 3: "
                          "the agents learn only the sum of all iterates, by additive secret sharing in "
                          "fixed point, in the engine; on Flower, Flower's SecAgg+ through the server, "
                          "which learns only that sum and broadcasts it; ldp-admm on the complete graph, "
                          "whose updates need only that sum)"},
    )
    secagg_range: float = field(
        default=32.0,
        metadata={"help": "c of Flower's SecAgg+ (exchange=secret on Flower): every iterate must lie in "
                          "[-c, c] (an agent whose iterate does not stops the run rather than be clipped); "
                          "the sum is quantised in steps of 2c / 2^22"},
    )
    noise: str = field(default="laplace", metadata={"help": "laplace (rate beta_k per coordinate) or none"})
    target_epsilon: float = field(
        default=0.0,
        metadata={"help": "the a-priori epsilon the run must cost exactly: the Laplace rates are calibrated "
                          "to it (Theorem 3.3: a constant beta = eps D / (B K d) for ldp-admm; Theorem 3.4: "
                          "beta_k = eps / (d K eta_k B) otherwise), less the grid's 2^-32 per release, so "
                          "that the run's statement is the target; 0 = the noise-growth schedule"},
    )
    noise_growth: float = field(
        default=1.02,
        metadata={"help": "beta_k = noise-growth^k, k = 1..K: the Laplace rate of the k-th release (scale "
                          "1/beta_k; the paper: 1.02, diminishing noise); not read with a target-epsilon"},
    )
    sensitivity: float = field(
        default=0.0,
        metadata={"help": "B_inf, how much one agent's gradient can change in a coordinate when one of its "
                          "samples is replaced; 0 = 2/b_i, the bound that holds (unit rows, labels +-1). The "
                          "paper uses 1/b_i = 0.01, half of it: a run with less than 2/b_i is labelled not "
                          "covered (Sec. 5 states 1/b_i for its 0/1 labels; with labels +-1 a coordinate "
                          "spans 2)"},
    )
    rounds: int = field(default=100, metadata={"help": "K, the iterations"})
    dataset: str = field(default="adult", metadata={"help": "adult (UCI Adult, 14 columns, unit rows)"})
    data_dir: str = field(default="", metadata={"help": "folder with adult.data and adult.test (or .gz); "
                                                        "empty: the cache, fetched on first use"})
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
        allowed("weights", self.weights, WEIGHTS)
        allowed("x-step", self.x_step, X_STEPS)
        allowed("graph", self.graph, GRAPHS)
        allowed("noise", self.noise, NOISES)
        allowed("exchange", self.exchange, EXCHANGES)
        allowed("dataset", self.dataset, DATASETS)
        allowed("device", self.device, DEVICES)
        allowed("dtype", self.dtype, DTYPES)
        keys.require(self, ">= 1", "rounds", "samples", "eval_every")
        check_equal_sizes(parse_scheme(self.partition), self.samples)
        keys.require(self, "> 0", "penalty", "zeta", "node_timeout", "round_timeout")
        keys.require(self, "finite and > 0", "secagg_range")
        if not self.sensitivity >= 0:
            raise ValueError(f"sensitivity={self.sensitivity!r} is not allowed; it must be >= 0 (0 = 2/b_i)")
        keys.require(self, "in (0, 1)", "step_decay")
        if self.agents < 3:
            raise ValueError(f"agents={self.agents} is not allowed; give at least 3")
        most = self.agents * (self.agents - 1) // 2
        if self.graph == "random" and not self.agents - 1 <= self.edges <= most:
            raise ValueError(f"edges={self.edges} is not allowed with agents={self.agents}; a connected "
                             f"graph has between {self.agents - 1} and {most}")
        if self.algorithm == "ldp-dgd" and self.graph != "complete":
            raise ValueError("algorithm='ldp-dgd' (Algorithm 2) needs graph='complete': its most divergent "
                             "pair and average are global; on other graphs use ldp-dgd-star (Algorithm 2*)")
        if self.x_step == "exact" and (self.algorithm != "ldp-admm" or self.private):
            raise ValueError(f"x-step='exact' (eq. (12)) is not allowed with algorithm={self.algorithm!r} "
                             f"and noise={self.noise!r}; it needs algorithm='ldp-admm' and noise='none' (its "
                             "release's sensitivity and ex-post interval are not those of Theorem 2.2)")
        if self.exchange == "secret" and (self.algorithm != "ldp-admm" or self.graph != "complete"):
            raise ValueError("exchange='secret' (Algorithm 3) needs algorithm='ldp-admm' and "
                             "graph='complete': only there does every update need nothing but the sum of all "
                             "iterates")
        if not (0 <= self.target_epsilon < math.inf) or (self.target_epsilon and not self.private):
            raise ValueError(f"target-epsilon={self.target_epsilon!r} is not allowed; give a finite value "
                             ">= 0 (0 = the noise-growth schedule), with noise='laplace'")
        if not (self.noise_growth >= 1 and math.isfinite(self.noise_growth)):
            raise ValueError(f"noise-growth={self.noise_growth!r} is not allowed; give a finite value >= 1")
        if self.target_epsilon:
            keys.require_default(self, "with a target-epsilon (it sets the rates)", "noise_growth")
        if self.graph == "complete":
            keys.require_default(self, "with graph='complete', which has every edge", "edges")
        keys.require_seed(self.seed)

    @property
    def private(self) -> bool:
        return self.noise == "laplace"

    @property
    def bound(self) -> float:
        """B_inf: the configured one, or 2/b_i."""
        return self.sensitivity or 2 / self.samples

    @property
    def covered(self) -> bool:
        """Whether B_inf is at least the proven 2/b_i, so that the stated epsilon is a guarantee."""
        return self.bound >= 2 / self.samples

    def alpha(self, k: int) -> float:
        """alpha_k, the factor of the gradient in the k-th update: 1/D (Algorithm 1), eta_k otherwise."""
        return 1 / self.penalty if self.algorithm == "ldp-admm" else self.step_decay**k

    def default_out(self) -> str:
        """runs/<algorithm>-<weights>-<dataset>-<noise>-seed<s>: the noise by the epsilon it was calibrated
        to (pure, per agent, the whole run), else by its growth (whose epsilon depends on K and d)."""
        noise = ("nonprivate" if not self.private else f"eps{self.target_epsilon:g}" if self.target_epsilon
                 else f"beta{self.noise_growth:g}")
        return f"runs/{self.algorithm}-{self.weights}-{self.dataset}-{noise}-seed{self.seed}"
