"""One run configuration for every execution path.

The Flower app reads it from ``context.run_config`` (the ``[tool.flwr.app.config.iadmm]`` table of
pyproject.toml, or ``iadmm-papers`` under the papers preset, overridable with ``flwr run . --run-config
"iadmm.<key>=..."``; :mod:`dpadmm.families`), the ``dpadmm`` CLI
builds one flag per field, and the engine takes the object itself. Keys are the field
names in kebab-case, so ``local_steps`` is ``local-steps`` everywhere. A run is a
function of this object (the seed included): nothing else enters the mathematics.

Validation happens here, where the values enter, and errors name the bad value and
what is allowed (the convention of Opacus and dp-accounting).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dpadmm import keys
from dpadmm.catalog import DATASET_NAMES as DATASETS
from dpadmm.catalog import DEFAULT_AGENTS, GENERATORS, MODELS
from dpadmm.data import refuse_unread_folder
from dpadmm.data.partition import parse_scheme
from dpadmm.keys import allowed, key
from dpadmm.privacy.device import NEIGHBOURING

ALGORITHMS = ("iadmm", "objp", "objpm", "objt", "outp")
DEVICES = ("cpu", "cuda")
DTYPES = ("float64", "float32")
RHO_PRESETS = ("main", "auto", "mnist", "femnist", "custom")
SENSITIVITIES = ("clipped", "data-dependent")
MECHANISMS = ("laplace", "gaussian")
PER_SAMPLE = ("auto", "vmap", "factorized")
TRUST_RADII = ("paper", "reference")
LOCAL_STARTS = ("chain", "global")
RELEASES = ("average", "last")
SERVER_UPDATES = ("admm", "mean")

# eq. (24) of 003: (c1, c2, Tc) per data set.
RHO_PRESET_VALUES = {"mnist": (2.0, 5.0, 10000), "femnist": (0.005, 0.05, 2000)}

# The papers' number of local updates for ObjPM (003, Section IV).
OBJPM_DEFAULT_LOCAL_STEPS = 10

# The main job's largest step for logistic regression: a = LOGISTIC_STEP P / C, a = 130 for the main job's 10
# agents at C = 1. Like a network's (NETWORK_STEP), a grows with the number of agents P, so that an agent's
# step on its own mean loss keeps its rate (about 12.9 at t = 1): a fixed a = 100 gave FEMNIST's 195 writers a
# rate of 0.43 and left the defaults 7.5 to 10.7 points of validation error behind DP-SGD + FedAvg there
# (docs/families/iadmm.md, "Many agents"). The rate is read where it binds, where the noise does not: on
# full MNIST (10 agents of 6,000 images, r below 0.6) a private run keeps it for most rounds. There, on the
# validation half (seeds 0-3, before any report run), 12 to 14 P / C did better than 10 at every eps and
# tied among themselves; 16 and 20 did a little better at eps 2 and worse at 4 and 8 (at 16 a seed in four
# ended well behind), and DP-SGD + FedAvg's tuning chose lr 16; the committed runs of the defaults before
# and after keep what it bought (the family page's full-MNIST table). Where the noise binds from round 1
# (the main job's data, FEMNIST) the damped rate room / (R r) does not depend on a: a moves only rho there.
# Without noise (unclipped, eq. (8)'s decay) a = 100 had been the best of 50, 100, 200 and 400 on the
# embedded data: the main job without noise ends at 10.5% test error under a = 130 where it ended at 10.1%
# (docs/getting-started.md).
LOGISTIC_STEP = 13.0
# The main job's rule for a network (RunConfig.scale and rho_constants): an agent's local step is DP-SGD on
# its own mean loss with learning rate at most NETWORK_STEP / C.
NETWORK_STEP = 4.0
# The pull towards w is a share of the proximal term's at t = 1 (rho = share / a; docs/families/iadmm.md,
# "Choosing rho and the proximal scale"): PULL_SHARE for a network, LOGISTIC_PULL_SHARE for logistic
# regression. The pull shrinks every local step's progress, noise and signal alike: in the model study
# (docs/results/models, whose runs.jsonl keeps both) the small CNN's defaults under a share of 0.2 ended 2.7
# to 5.7 points of test error behind 0.02 at eps 1 to 8, and the MLP's within 0.7 points of it (no smaller
# share has been measured for a network). For logistic regression a smaller share did better on full
# MNIST's validation half at every eps and tied on the main job's data and FEMNIST's (seeds 0-3), hence its
# own, LOGISTIC_PULL_SHARE (rho = 3.8e-5 in the main job).
PULL_SHARE = 0.02
LOGISTIC_PULL_SHARE = 0.005
# ... and for any model, the learning rate times the noise ratio r (one step's noise over its largest clean
# gradient) is at most its room (RunConfig.noise_room_for): the step follows the noise
# (schedules.noise_damping). NOISE_ROOM for every network but the MLP, MLP_NOISE_ROOM for it, and sqrt(P K)
# for logistic regression (P agents, K classes), read off the validation half of the model study's test data
# (python -m benchmarks.noise_room, docs/results/noise-room), where no one room suited every model: 10
# suited logistic regression (P = K = 10 there) and the small CNN, which lost up to 18 points under 20; the
# MLP did best at 15 to 20 and lost up to 2.9 points under 10; with FEMNIST's 195 writers and 62 classes,
# logistic regression did best at 110 to 199. Logistic regression's rate at t = 1 is taken as a C / ((1 +
# LOGISTIC_RATE_SHARE) P), 8.3 for the a = 10 P / C of the time: the estimate its room was fitted with (the
# damped rate room / (R r) is (1 + LOGISTIC_RATE_SHARE) P room / (C r) whatever a).
NOISE_ROOM, MLP_NOISE_ROOM, LOGISTIC_RATE_SHARE = 10.0, 20.0, 0.2


@dataclass(frozen=True)
class RunConfig(keys.Keyed):
    """Every hyper-parameter of a DP-IADMM run (003 Algorithm 1 and the baseline OutP).

    The defaults are the main job's, the same as ``dpadmm train`` and ``flwr run .`` without flags:
    budget-first ((8, 1e-5)-DP for the whole run per agent, eps-bar calibrated to it), Poisson-subsampled
    Gaussian objective perturbation with C = 1, and the main job's step (:attr:`scale`). The papers'
    settings are :func:`papers` (:data:`PAPERS` over these).
    """

    algorithm: str = field(
        default="objpm",
        metadata={"help": "iadmm (non-private), objp (E=1), objpm (E local updates), "
                          "objt (trust region, 000), outp (output perturbation baseline)"},
    )
    epsilon: float = field(
        default=0.0,
        metadata={"help": "per-local-step privacy parameter eps-bar of eq. (9a) (its noise multiplier 1 / "
                          "eps-bar for gaussian); inf = non-private; 0 = calibrated to target-epsilon (only "
                          "then: giving eps-bar with a target is refused)"},
    )
    rounds: int = field(default=10, metadata={"help": "communication rounds T"})
    local_steps: int = field(
        default=0,
        metadata={"help": "local updates E per round; 0 = the algorithm's default "
                          f"({OBJPM_DEFAULT_LOCAL_STEPS} for objpm, 1 otherwise)"},
    )
    num_agents: int = field(
        default=0,
        metadata={"help": "number of agents P (in a simulation: equal to num-supernodes); 0 = the data "
                          "set's (10 for default and mnist, 195 for femnist: its first P writers)"},
    )
    dataset: str = field(
        default="default",
        metadata={"help": "default (embedded 5,000-image MNIST sample), mnist (IDX files, downloaded if "
                          "absent) or femnist (LEAF JSON samples, one agent per writer)"},
    )
    data_dir: str = field(
        default="",
        metadata={"help": "folder with the data set's files (mnist: the four IDX files, raw or .gz; femnist: "
                          "a LEAF sample folder with train/ and test/, a folder of such samples, or several "
                          "comma-separated); empty: the cache, fetched on first use"},
    )
    partition: str = field(
        default="contiguous",
        metadata={"help": "how the training samples are dealt to the agents (public): contiguous (the "
                          "papers' blocks, near-IID), dirichlet:ALPHA (label skew: 0.1 strong, 1000 "
                          "near-IID), shards:K (K label-sorted shards per agent) or quantity:ALPHA (sizes "
                          "skewed); femnist keeps its writers"},
    )
    partition_seed: int = field(default=0, metadata={"help": "seed of the partition's draw (public), "
                                                             "0 <= seed < 2**32"})
    seed: int = field(default=0, metadata={"help": "seed of the noise streams, 0 <= seed < 2**32"})
    device: str = field(default="cpu", metadata={"help": "compute device: cpu or cuda"})
    dtype: str = field(default="float64", metadata={"help": "float64 (as the papers' code) or float32"})
    eval_every: int = field(default=1, metadata={"help": "evaluate w every this many rounds"})
    out: str = field(
        default="",
        metadata={"help": "output folder for metrics.jsonl; empty = "
                          "runs/<algorithm>-eps<eps>-E<E>-seed<seed>; an existing run is never overwritten "
                          "(a _1, _2 suffix is added)"},
    )
    save_weights: bool = field(
        default=False, metadata={"help": "also write w of every evaluated round to weights.npz"}
    )
    prox_scale: float = field(
        default=0.0,
        metadata={"help": "scaling constant a of eta^t = a/sqrt(t) and the trust radius a/t^2 (000 A.11); "
                          f"0 = the main job's: {LOGISTIC_STEP:g} P / clip-norm for logistic regression, "
                          f"{NETWORK_STEP * (1 + PULL_SHARE):g} P / clip-norm for a network (a private "
                          "run's eta^t then decays only as far as its noise needs, as a network's does "
                          "without noise too)"},
    )
    noise_room: float = field(
        default=0.0,
        metadata={"help": "under the main job's step (prox-scale 0), the most its learning rate times the "
                          "noise ratio r (one step's noise over its largest clean gradient) may be (a "
                          "network's: at round t, that over sqrt(t)); 0 = the "
                          f"model's: {MLP_NOISE_ROOM:g} for mlp, sqrt(P K) for logistic regression with K "
                          f"classes, {NOISE_ROOM:g} for every other"},
    )
    trust_radius: str = field(
        default="paper",
        metadata={"help": "objt's trust radius: paper (a/t^2, 000 eq. (9) and A.11) or reference (the "
                          "constant a that the authors' code computes, `a / (iteration+1)*(iteration+1)`)"},
    )
    beta: float = field(default=1e-6, metadata={"help": "L2 regularisation beta of eq. (2c)"})
    rho_preset: str = field(
        default="main",
        metadata={"help": "rho^t: main (the main job's constant rho, "
                          f"{PULL_SHARE:g} / a for a network, {LOGISTIC_PULL_SHARE:g} / a for logistic "
                          "regression), "
                          "or the constants of eq. (24): auto (by data set), mnist, femnist, custom"},
    )
    rho_c1: float = field(default=2.0, metadata={"help": "c1 of eq. (24), used when rho-preset=custom"})
    rho_c2: float = field(default=5.0, metadata={"help": "c2 of eq. (24), used when rho-preset=custom"})
    rho_tc: int = field(default=10000, metadata={"help": "Tc of eq. (24), used when rho-preset=custom"})
    outp_delta: float = field(default=1e-6, metadata={"help": "delta of the OutP Gaussian mechanism (outp "
                                                              "only)"})
    sensitivity: str = field(
        default="clipped",
        metadata={"help": "Laplace calibration: clipped (per-sample L1 clipping to clip-norm, Delta = 2C/I, "
                          "covered by Theorem 1) or data-dependent (the papers' eq. (9b), not covered)"},
    )
    clip_norm: float = field(
        default=1.0,
        metadata={"help": "C: bound of each sample's gradient (L1 for laplace, L2 for gaussian); for "
                          "logistic regression the term x_i (h_i - y_i)^T"},
    )
    mechanism: str = field(
        default="gaussian",
        metadata={"help": "noise of the objective perturbation: laplace (eq. (9a), L1 clipping, pure eps-bar "
                          "per step) or gaussian (L2 clipping, noise std Delta_2 / epsilon; (eps, delta) by "
                          "the ledger)"},
    )
    model: str = field(
        default="logistic",
        metadata={"help": "logistic (the papers' model, closed-form fast path), cnn (the LEAF CNN, 6.6 M "
                          "parameters), small-cnn (Tramer and Boneh's 26k-parameter tanh CNN, sized for DP), "
                          "scatter-cnn (their 35k-parameter CNN on fixed scattering features of the images), "
                          "mlp (one hidden layer of 64), or custom (any nn.Module given through the Python "
                          "API)"},
    )
    per_sample: str = field(
        default="auto",
        metadata={"help": "how a module model's per-sample gradients are clipped: auto (factorized for the "
                          "built-in networks, vmap for a custom module), vmap (torch.func, any module) or "
                          "factorized (norms of Linear and Conv2d layers from their inputs and output "
                          "gradients, for modules made of such layers, each applied once per forward pass: "
                          "much faster for large dense layers)"},
    )
    noise_generator: str = field(
        default="philox",
        metadata={"help": "philox (counter-based, bit-identical on CPU and CUDA; a fused C kernel on CPUs, a "
                          "compiled kernel on GPUs) or torch (torch's CPU generator seeded per agent, round "
                          "and step from Philox: the same numbers on every execution path of one torch "
                          "build, not Philox's)"},
    )
    batch_size: int = field(
        default=0,
        metadata={"help": "samples per local step for a module model (drawn from a keyed stream); "
                          "0 = full batch, as in the papers"},
    )
    local_start: str = field(
        default="global",
        metadata={"help": "where a round's E local steps start: chain (the agent's last local iterate, line "
                          "16 of 003 Algorithm 1) or global (the round's w^{t+1}, as FedAvg restarts every "
                          "client; not in the papers; the start is public, so the privacy is unchanged)"},
    )
    release: str = field(
        default="last",
        metadata={"help": "what an agent sends after its E local steps: average (the mean of the E iterates, "
                          "line 21 of 003 Algorithm 1) or last (the last iterate, as FedAvg's clients send); "
                          "both are functions of the noisy steps, so the privacy is unchanged"},
    )
    server_update: str = field(
        default="mean",
        metadata={"help": "the server's w and the duals' order: admm (003: eq. (4a), then the duals against "
                          "the w the round sent, which at a constant rho extrapolates the mean release, 2 "
                          "zbar^t - zbar^(t-1)) or mean (consensus ADMM's order: w is the mean release and "
                          "the duals are updated against it, so they sum to zero and correct each agent's "
                          "drift only); post-processing of the releases either way"},
    )
    sampling_rate: float = field(
        default=0.2,
        metadata={"help": "Poisson rate q: each local step takes each sample independently with "
                          "probability q (a keyed stream of seed, agent, round and step) and scales the "
                          "clipped sum by 1/(qI); the ledger credits the amplification (dp-accounting's "
                          "PoissonSampledDpEvent), which needs neighbouring=add-remove and "
                          "sensitivity=clipped. 1 = every sample, as in the papers"},
    )
    neighbouring: str = field(
        default="add-remove",
        metadata={"help": "neighbouring data sets: replace-one (one sample replaced) or add-remove"},
    )
    delta: float = field(default=1e-5, metadata={"help": "delta at which the privacy ledger reports epsilon"})
    target_epsilon: float = field(
        default=8.0,
        metadata={"help": "whole-run epsilon at delta to calibrate eps-bar for before training; 0 = off"},
    )
    fraction_train: float = field(
        default=1.0,
        metadata={"help": "fraction of the P agents sampled each round (partial participation), in (0, 1]; "
                          "the sample is drawn from a keyed stream of seed and round, so the engine samples "
                          "the same agents"},
    )
    node_timeout: float = field(
        default=60.0,
        metadata={"help": "seconds the Flower server waits at its start for every agent's node to connect "
                          "(Flower app only)"},
    )
    round_timeout: float = field(
        default=600.0,
        metadata={"help": "seconds the Flower server waits for the replies of a round; later replies are "
                          "dropped (Flower app only)"},
    )

    def __post_init__(self) -> None:
        self.check_types()
        allowed("algorithm", self.algorithm, ALGORITHMS)
        allowed("dataset", self.dataset, DATASETS)
        refuse_unread_folder(self.dataset, self.data_dir)
        if self.num_agents == 0:  # resolved here, so every reader sees the actual P
            object.__setattr__(self, "num_agents", DEFAULT_AGENTS[self.dataset])
        if parse_scheme(self.partition).skewed and self.dataset == "femnist":
            raise ValueError(f"partition={self.partition!r} is not allowed with dataset='femnist', whose "
                             "agents are its writers (the natural partition); leave partition='contiguous'")
        allowed("device", self.device, DEVICES)
        allowed("dtype", self.dtype, DTYPES)
        allowed("rho-preset", self.rho_preset, RHO_PRESETS)
        allowed("sensitivity", self.sensitivity, SENSITIVITIES)
        allowed("neighbouring", self.neighbouring, NEIGHBOURING)
        allowed("mechanism", self.mechanism, MECHANISMS)
        allowed("model", self.model, MODELS)
        allowed("noise-generator", self.noise_generator, GENERATORS)
        allowed("per-sample", self.per_sample, PER_SAMPLE)
        allowed("trust-radius", self.trust_radius, TRUST_RADII)
        allowed("local-start", self.local_start, LOCAL_STARTS)
        allowed("release", self.release, RELEASES)
        allowed("server-update", self.server_update, SERVER_UPDATES)
        if self.trust_radius != "paper" and self.algorithm != "objt":
            raise ValueError(f"trust-radius={self.trust_radius!r} is not allowed with algorithm="
                             f"{self.algorithm!r}: the trust radius is objt's; leave it 'paper'")
        self._check_model()  # before OutP's round keys: OutP under the main preset is refused for its noise
        self._check_outp_round()
        keys.require(self, "finite and > 0", "clip_norm")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta={self.delta!r} is not allowed; it must be in (0, 1)")
        if not 0 <= self.target_epsilon < math.inf:
            raise ValueError(f"target-epsilon={self.target_epsilon!r} is not allowed; it must be finite and "
                             "> 0 (0 = off; a non-private run is epsilon=inf with target-epsilon=0)")
        if self.target_epsilon and self.algorithm == "iadmm":
            raise ValueError("target-epsilon is not allowed with algorithm='iadmm', which is non-private")
        self._check_epsilon()
        for name in ("rounds", "num_agents", "eval_every", "rho_tc"):
            if getattr(self, name) < 1:
                raise ValueError(f"{key(name)}={getattr(self, name)!r} is not allowed; it must be >= 1")
        if self.local_steps < 0:
            raise ValueError(
                f"local-steps={self.local_steps!r} is not allowed; it must be >= 0 (0 = the default)")
        if self.algorithm in ("objp", "outp") and self.local_steps > 1:
            raise ValueError(
                f"local-steps={self.local_steps} is not allowed with algorithm={self.algorithm!r}, "
                "which makes one local update per round; use algorithm='objpm' for E > 1"
            )
        for name in ("seed", "partition_seed"):
            if not 0 <= getattr(self, name) < 2**32:
                raise ValueError(f"{key(name)}={getattr(self, name)!r} is not allowed; it must satisfy "
                                 "0 <= seed < 2**32")
        keys.require(self, "finite and > 0", "rho_c1")
        if not (self.prox_scale >= 0 and math.isfinite(self.prox_scale)):
            raise ValueError(f"prox-scale={self.prox_scale!r} is not allowed; it must be finite and >= 0 "
                             "(0 = the main job's rule)")
        keys.require(self, "finite and >= 0", "noise_room")
        if self.prox_scale > 0:
            keys.require_default(self, "with a given prox-scale, only with prox-scale=0", "noise_room")
        keys.require(self, "finite and >= 0", "beta", "rho_c2")
        if self.rho_preset != "custom":
            keys.require_default(self, f"with rho-preset={self.rho_preset!r}, only with rho-preset='custom'",
                                 "rho_c1", "rho_c2", "rho_tc")
        for name in ("node_timeout", "round_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"{key(name)}={getattr(self, name)!r} is not allowed; it must be > 0 seconds")
        if not 0 < self.fraction_train <= 1:
            raise ValueError(f"fraction-train={self.fraction_train!r} is not allowed; it must be in (0, 1]")
        if not 0 < self.outp_delta < 1:
            raise ValueError(f"outp-delta={self.outp_delta!r} is not allowed; it must be in (0, 1)")
        if self.algorithm != "outp":
            keys.require_default(self, f"with algorithm={self.algorithm!r}, only with algorithm='outp'",
                                 "outp_delta")

    def _check_epsilon(self) -> None:
        """eps-bar is given (> 0, inf = non-private) or, with 0, calibrated to target-epsilon; eps-bar given
        with a target is refused (it would be silently replaced), unless it is that calibration's own value
        (what :func:`dpadmm.iadmm.privacy.calibrate` returns, and a run's config.json records)."""
        if math.isnan(self.epsilon) or self.epsilon < 0:
            raise ValueError(f"epsilon={self.epsilon!r} is not allowed; it must be > 0 (inf = non-private; "
                             "0 = calibrated to the whole-run target)")
        if not self.target_epsilon:
            if self.epsilon == 0 and self.algorithm != "iadmm":
                raise ValueError("epsilon=0 is not allowed with target-epsilon=0: give eps-bar per local "
                                 "step (> 0, inf = non-private) or a whole-run target-epsilon to calibrate "
                                 "it")
            return
        if self.epsilon == 0:
            return
        from dpadmm.iadmm.calibration import calibrated_epsilon  # the accountant: not for `dpadmm --help`

        calibrated = calibrated_epsilon(self)
        if self.epsilon != calibrated:
            raise ValueError(
                f"epsilon={self.epsilon!r} is not used while target-epsilon={self.target_epsilon:g} "
                f"calibrates eps-bar for the whole run (to {calibrated:.6g}); give target-epsilon=0 with it, "
                "or leave epsilon out")

    def _check_outp_round(self) -> None:
        """OutP's round is Huang et al.'s one step from its last output and its output noise: the papers'
        local start, release and server update (the papers preset's), nothing else."""
        if self.algorithm != "outp":
            return
        for name, value, papers_value in (("local-start", self.local_start, "chain"),
                                          ("release", self.release, "average"),
                                          ("server-update", self.server_update, "admm")):
            if value != papers_value:
                raise ValueError(f"{name}={value!r} is not allowed with algorithm='outp', whose round is "
                                 f"Huang et al.'s one step from its last output and its output noise; leave "
                                 f"{name}={papers_value!r}")

    def _check_model(self) -> None:
        """The combinations the theory covers: what a module model and the Gaussian variant need."""
        if self.batch_size < 0:
            raise ValueError(f"batch-size={self.batch_size!r} is not allowed; it must be >= 0 "
                             "(0 = full batch)")
        if self.mechanism == "gaussian" and (self.algorithm == "outp" or self.sensitivity != "clipped"):
            culprit = ("algorithm='outp'" if self.algorithm == "outp"
                       else f"sensitivity={self.sensitivity!r}")
            raise ValueError(f"mechanism='gaussian' is not allowed with {culprit}; it is the objective "
                             "perturbation with L2-clipped gradients (sensitivity='clipped')")
        if not 0 < self.sampling_rate <= 1:
            raise ValueError(f"sampling-rate={self.sampling_rate!r} is not allowed; it must be in (0, 1] "
                             "(1 = every sample, the papers' full batch)")
        if self.sampling_rate < 1:
            self._check_sampling()
        if self.model == "logistic":
            if self.per_sample == "factorized":
                raise ValueError(f"per-sample={self.per_sample!r} is not allowed with model='logistic', "
                                 "whose fast path clips by a factorised norm already; it is for networks")
            if self.batch_size:
                raise ValueError(f"batch-size={self.batch_size} is not allowed with model='logistic', whose "
                                 "closed-form fast path is full-batch as in the papers; use 0")
            return
        if self.algorithm == "outp":
            raise ValueError(f"algorithm='outp' is not allowed with model={self.model!r}: OutP's sensitivity "
                             "is derived for logistic regression only")
        if self.sensitivity != "clipped":
            raise ValueError(f"sensitivity={self.sensitivity!r} is not allowed with model={self.model!r}: "
                             "eq. (9b) is derived for logistic regression; use 'clipped'")
        if self.batch_size and self.neighbouring != "replace-one":
            raise ValueError(f"batch-size={self.batch_size} is not allowed with neighbouring="
                             f"{self.neighbouring!r}: the minibatch scale I_p / B is public only when "
                             "one sample is replaced; use replace-one or batch-size=0")

    def _check_sampling(self) -> None:
        """What Poisson subsampling needs: the clipped objective perturbation and add-remove neighbours."""
        culprit = None
        if self.algorithm == "outp":
            culprit = "algorithm='outp', whose output perturbation takes the full local mean"
        elif self.sensitivity != "clipped":
            culprit = f"sensitivity={self.sensitivity!r}, which is computed from the data; use 'clipped'"
        elif self.batch_size:
            culprit = (f"batch-size={self.batch_size} (fixed-size minibatches, not credited); use one of "
                       "the two")
        elif self.neighbouring != "add-remove":
            culprit = (f"neighbouring={self.neighbouring!r}: amplification by Poisson subsampling is "
                       "stated for one sample added or removed; set neighbouring='add-remove'")
        if culprit:
            raise ValueError(f"sampling-rate={self.sampling_rate:g} is not allowed with {culprit}")

    # ----- derived values (computed, never stored, so they cannot disagree) -----

    @property
    def private(self) -> bool:
        """Whether noise is drawn: iadmm is the non-private IADMM whatever epsilon says."""
        return self.algorithm != "iadmm" and math.isfinite(self.epsilon)

    @property
    def calibrated(self) -> bool:
        """Whether eps-bar is known: given, or calibrated to target-epsilon (never for a non-private run)."""
        return self.epsilon > 0 or not self.private

    @property
    def effective_epsilon(self) -> float:
        """eps-bar as the noise uses it (inf without noise); refused before calibration, which would
        otherwise run without the noise the target needs."""
        if not self.calibrated:
            raise ValueError(f"eps-bar is not calibrated yet for target-epsilon={self.target_epsilon:g}: "
                             "call dpadmm.iadmm.privacy.calibrate(config) first (the engine, the strategy "
                             "and the clients' train_reply do)")
        return self.epsilon if self.private else math.inf

    @property
    def network_rule(self) -> bool:
        """Whether the main job's rule for a network sets the step: ``prox-scale`` 0 and any model but
        logistic regression (which has a rule of its own, :attr:`scale`)."""
        return self.prox_scale == 0 and self.model != "logistic"

    @property
    def clipped(self) -> bool:
        """Whether per-sample clipping is in force, and in a private run the data-independent Laplace scale.

        A private run clips (its sensitivity needs it); so does a network under the main job's rule without
        noise, whose rate is in units of 1 / C (:attr:`scale`): unclipped, the small CNN's first step on the
        main job's data left it at chance for the whole run (test error 0.90, seeds 0-2), clipped it ends at
        4.5%, the same steps as a private run's, without their noise."""
        if self.sensitivity != "clipped" or self.algorithm == "outp":
            return False
        return self.private or self.network_rule

    @property
    def clip_norm_type(self) -> str:
        """The norm of per-sample clipping and of the sensitivity: l1 for Laplace, l2 for Gaussian noise."""
        return "l2" if self.mechanism == "gaussian" else "l1"

    @property
    def steps(self) -> int:
        """E, the number of local updates per round."""
        if self.local_steps:
            return self.local_steps
        return OBJPM_DEFAULT_LOCAL_STEPS if self.algorithm == "objpm" else 1

    @property
    def sends_last_iterate(self) -> bool:
        """Whether an agent's reply carries its last local iterate beside z (``z-last``): only when it differs
        from what z is, the average of E > 1 iterates."""
        return self.steps > 1 and self.release == "average"

    @property
    def scale(self) -> float:
        """a, the scale of eta^t = a / sqrt(t) (and of ObjT's radius): ``prox-scale``, or with 0 the main
        job's largest, which needs no search:

        - logistic regression: a = LOGISTIC_STEP P / C, the main job's a = 130 with its 10 agents at C = 1:
          by the same argument as below (with rho = LOGISTIC_PULL_SHARE / a), a learning rate of 13 /
          (1.005 C) at t = 1 whatever the number of agents;
        - a network: a = NETWORK_STEP (1 + PULL_SHARE) P / C. With rho = PULL_SHARE / a the local step
          of eq. (8) is z - s (g + xi - lambda_p + rho (z - w)) with s = a / (sqrt(t) + PULL_SHARE); g
          is (I_p / I) times the agent's mean clipped gradient (unbiased under Poisson sampling at any q),
          and I / I_p is P on average, so at t = 1 the agent takes DP-SGD steps of learning rate
          NETWORK_STEP / C on its own mean loss: a clean step of norm at most NETWORK_STEP, whatever the
          number of agents, their sizes, the clip norm or q.

        The noise enters the same step, and its size relative to the signal is fixed by the budget, not by
        a: a private run's local steps use a times :func:`dpadmm.iadmm.schedules.noise_damping`, which
        lowers the rate to the room (:meth:`noise_room_for`) / r where the noise ratio r would make it larger
        (rho stays what :attr:`rho_constants` says for the a returned here), and the rate decays over the
        rounds only as far as the noise needs (:func:`dpadmm.iadmm.schedules.local_eta`). Measured
        on the main job's data (the validation half, docs/results/noise-room): the room that suits logistic
        regression and the small CNN costs the MLP up to 2.9 points of test error, and the MLP's costs the
        small CNN up to 18, hence one room for the MLP and one for the rest; rates 1 and 16 without the
        damping did no better than the rule for any model at eps 8 (docs/results/step-rule).
        """
        if self.prox_scale > 0:
            return self.prox_scale
        if self.model == "logistic":
            return LOGISTIC_STEP * self.num_agents / self.clip_norm
        return NETWORK_STEP * (1 + PULL_SHARE) * self.num_agents / self.clip_norm

    def noise_room_for(self, classes: int) -> float:
        """The most the learning rate times the noise ratio r may be (schedules.noise_damping):
        ``noise-room``, or with 0 the model's, read off the model study's validation halves (the comment above
        NOISE_ROOM): MLP_NOISE_ROOM for the built-in MLP, NOISE_ROOM for every other network (a module given
        through the Python API included; ``classes`` is then not read), and sqrt(P K) for logistic
        regression with P agents and K = ``classes``: 10 in the main job, 110 with FEMNIST's 195 writers and
        62 classes. Two reasons r overstates what a linear model's noise costs, neither in r itself: the
        server averages the P agents' releases, whose noise shrinks there as 1 / sqrt(P) and whose signal
        does not; and r counts the noise on all K columns of the weights, where a sample's logit sees one
        column's (a fraction 1 / sqrt(K) of it) and its clipped gradient falls mostly on the column of its
        own class. Measured on FEMNIST (docs/results/noise-room, validation half): rooms of 22 to 88 did
        worse, 199 within 0.23 points at every eps (at most 1.6 standard errors of the paired difference)."""
        if self.noise_room > 0:
            return self.noise_room
        if self.model == "logistic":
            return math.sqrt(self.num_agents * classes)
        return MLP_NOISE_ROOM if self.model == "mlp" else NOISE_ROOM

    @property
    def rho_constants(self) -> tuple[float, float, int]:
        """(c1, c2, Tc) of eq. (24); ``main``: the constant rho of the main job (c2 = 0), share / a with a =
        :attr:`scale`: LOGISTIC_PULL_SHARE for logistic regression (rho = 3.8e-5 in the main job), PULL_SHARE
        for a network."""
        if self.rho_preset == "custom":
            return (self.rho_c1, self.rho_c2, self.rho_tc)
        if self.rho_preset == "main":
            rho = (LOGISTIC_PULL_SHARE if self.model == "logistic" else PULL_SHARE) / self.scale
            return (rho, 0.0, self.rho_tc)
        preset = self.rho_preset
        if preset == "auto":
            preset = "femnist" if self.dataset == "femnist" else "mnist"
        return RHO_PRESET_VALUES[preset]

    def default_out(self) -> str:
        """runs/<algorithm>-<privacy>-E<steps>-seed<seed>: a budget-first run is named after its whole-run
        (eps, delta), the figure a user quotes (``eps8-delta1e-05``), not after the per-step eps-bar its
        calibration found; a run given eps-bar is named after that, labelled per step (``epsbar0.5``);
        ``epsinf`` releases without noise."""
        if not self.private:
            label = "epsinf"
        elif self.target_epsilon:
            label = f"eps{self.target_epsilon:g}-delta{self.delta:g}"
        else:
            label = f"epsbar{self.epsilon:g}"
        return f"runs/{self.algorithm}-{label}-E{self.steps}-seed{self.seed}"


# The main job: RunConfig's defaults, what `flwr run .` (pyproject.toml's [tool.flwr.app.config.iadmm] table,
# the `main` preset) and `dpadmm train` without flags run, budget-first: Poisson-subsampled Gaussian
# objective perturbation, C = 1, T = 10 rounds of E = 10 steps (objpm's own), a constant rho and eta^t of
# eq. (8) (the kind of configuration the comparison with DP-SGD + FedAvg tunes, docs/results/compare/),
# eps-bar calibrated so that the whole run is (8, 1e-5)-DP per agent for one sample added or removed. For
# logistic regression q = 0.2 was picked among eight settings by their test error on the embedded data over
# seeds 0-2 (docs/getting-started.md says so); the step a and rho follow a rule (RunConfig.scale,
# rho_constants) for every model. A round runs as FedAvg's clients and server do (each agent's local steps
# start from w, it sends its last iterate, and w is the mean of what was sent, with the duals answering it:
# consensus ADMM's order); measured on the main job's data, the round and the rule together beat the papers'
# round and the former step for every model and eps tried (docs/results/models).
#
# The papers' configuration over those defaults (eps-bar per local step, full batches, Laplace noise on
# L1-clipped gradients, T = 50, a = 1 and the eq. (24) presets): the `papers` preset
# ([tool.flwr.app.config.iadmm-papers], `dpadmm train --preset papers`, :func:`papers`).
PAPERS: dict[str, Any] = {
    "epsilon": 1.0, "target_epsilon": 0.0, "rounds": 50, "mechanism": "laplace", "clip_norm": 200.0,
    "sampling_rate": 1.0, "neighbouring": "replace-one", "prox_scale": 1.0, "rho_preset": "auto",
    "local_start": "chain", "release": "average", "server_update": "admm",
}


def main_job() -> RunConfig:
    """The main job's configuration: RunConfig's defaults."""
    return RunConfig()


def papers(**values: Any) -> RunConfig:
    """The papers' configuration (:data:`PAPERS` over the defaults) with ``values`` (field names) over it; a
    ``target_epsilon`` given without ``epsilon`` calibrates eps-bar (the preset's eps-bar is left out)."""
    if values.get("target_epsilon") and "epsilon" not in values:
        values = {**values, "epsilon": 0.0}
    return RunConfig(**{**PAPERS, **values})


PRESETS = ("main", "papers")


def preset_values(preset: str) -> dict[str, Any]:
    """The kebab-case keys of a preset, every one written out: ``main`` (the main job, the dataclass's
    defaults) or ``papers`` (the papers' settings, :func:`papers`)."""
    allowed("preset", preset, PRESETS)
    # num-agents as written (0: the data set's own count), not as resolved for the default data set, so
    # that a preset with another data set gives that data set's count (195 FEMNIST writers)
    return {**(main_job() if preset == "main" else papers()).to_mapping(), "num-agents": 0}


def requested(given: Mapping[str, Any], preset: str = "main") -> RunConfig:
    """The configuration a user asks for: the preset's values with the kebab-case keys ``given`` over them.

    A given value is used as given, never replaced by the preset's: the preset only fills the keys left
    out. One given key has nothing to act on under a target: ``epsilon`` (eps-bar per local step) while
    ``target-epsilon`` > 0 calibrates eps-bar for the whole run, so that combination is refused rather than
    silently overwritten. A combination the preset's own values make impossible (``algorithm='outp'``
    with the main job's Gaussian noise) is refused with the preset named, so the user knows where the
    other value came from.
    """
    base = preset_values(preset)
    if "epsilon" not in given and keys.coerce("target-epsilon", given.get("target-epsilon", 0), "float"):
        base = {**base, "epsilon": 0.0}  # a target given calibrates eps-bar: the preset's is left out
    try:
        config = RunConfig.from_mapping({**base, **given})
    except ValueError as error:
        if preset != "main" or str(error).startswith("unknown"):
            raise
        papers = preset_values("papers")
        culprits = [k for k, v in base.items() if k not in given and v != papers[k]
                    and re.search(rf"(?<![\w-]){k}(?![\w-])", str(error))]
        if not culprits:
            raise
        raise ValueError(f"{error} (the main preset sets {', '.join(culprits)}; give it, or use the papers "
                         "preset)") from None
    if given.get("epsilon") not in (None, 0) and config.target_epsilon > 0:
        raise ValueError(
            f"epsilon={given['epsilon']!r} is not used while target-epsilon={config.target_epsilon:g} "
            "calibrates eps-bar for the whole run; give target-epsilon=0 with it, or use the papers "
            "preset (eps-bar per local step, as the papers)")
    return config


def from_app_config(own: Mapping[str, Any], preset: str = "main") -> RunConfig:
    """:func:`requested` for the keys of a Flower run config's DP-IADMM table (``iadmm.*`` for the main
    preset, ``iadmm-papers.*`` for the papers'): Flower hands the table with the user's ``--run-config``
    merged over pyproject.toml's values, which are the preset's own, so the keys given are those whose
    value differs from the preset's. A value equal to the preset's runs the same either way."""
    base = preset_values(preset)
    types = {key(f.name): f.type for f in fields(RunConfig)}
    # a value as TOML or flwr gives it (ints for floats, "inf" strings) is compared once coerced to its field
    given = {k: v for k, v in own.items() if k not in base or keys.coerce(k, v, types[k]) != base[k]}
    return requested(given, preset)
