"""The privacy ledger of every family: DP events in, (epsilon, delta) per step, per round and per run out.

A family says what one agent releases as a :class:`Release` (the mechanism, its noise
multiplier, the Poisson sampling rate of the records it reads) and how many of them make a
round and a run; this module composes them with Google's ``dp-accounting`` (the
privacy-loss-distribution accountant, and RDP as a cross-check), next to basic and advanced
composition, and inverts the accountant for budget-first runs. It knows no family: what a
release covers (sensitivity, neighbouring relation, who is trusted) is the family's to state,
in the :class:`Ledger`'s text fields.

A release's noise multiplier is its noise scale (Laplace b, Gaussian sigma) over its
sensitivity under the family's neighbouring relation (one sample replaced, or added/removed).
The PLD of such a mechanism is that of one shifted pair of noise distributions whatever the
relation, so it is composed with dp-accounting's add-or-remove accountant, the one that
implements the Laplace PLD.

Every number describes the mechanism a deployment runs (:mod:`dpadmm.privacy.secure`): noise on a grid,
whose rounding adds at most 2**-GRID_BITS to 1/multiplier (:attr:`Release.deployed_multiplier` is what
is composed), and whose discrete noise gives every output a probability within a factor e^GRID_RATIO
of the rounded continuous noise's (a post-processing of the continuous mechanism), so that every
(epsilon, delta) composed here adds 2 GRID_RATIO to epsilon per release and scales delta by e^GRID_RATIO
(:func:`_at`). The simulation kind's continuous noise is the ideal mechanism. Both costs are far below
the printed digits.

``dp-accounting`` (with SciPy's statistics, over a second to import) is imported where it is used, so
that a Flower ClientApp, which starts a process per message in a deployment and never composes
events, does not pay for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpadmm.privacy.secure import GRID_BITS, GRID_RATIO, GRID_TAIL, MIN_GAUSSIAN_MULTIPLIER

if TYPE_CHECKING:
    import dp_accounting

# Discretisation of the PLD accountant: pessimistic (a valid upper bound) at any interval;
# 1e-3 is within 1e-5 relative of 1e-4 on the papers' settings and ten times faster.
PLD_INTERVAL = 1e-3
CALIBRATION_INTERVAL = 1e-2  # coarser, so more pessimistic: the calibrated run meets its target
# The PLD accountant's cost grows with the count of releases (its self-composition) and with the composed
# epsilon (its distribution's support at PLD_INTERVAL): 1e7 sampled Gaussian releases take 76 s, 1e6 Laplace
# releases of epsilon 1441 take 15 s, one Laplace release of eps-bar 1e6 runs out of memory. A statement must
# come in seconds, so beyond PLD_MAX_RELEASES releases, or where the fast bounds already exceed
# PLD_COARSE_MAX_EPSILON (no guarantee anyone would quote), :func:`composed_epsilon` states the tightest of
# the bounds that stay fast (:func:`fast_epsilon`): exact for unsampled Gaussian releases, pure composition
# for unsampled Laplace ones, RDP, basic and advanced composition; each valid, the method named.
PLD_MAX_RELEASES = 10**6
PLD_MAX_EPSILON = 1000.0
# Between PLD_MAX_EPSILON and this, or beyond PLD_FINE_WORK releases times epsilon (1e6 releases of epsilon
# 900: 10 s), the PLD accountant is asked at CALIBRATION_INTERVAL instead (ten times faster, still an upper
# bound, and the calibration's own discretisation, so a calibrated run is stated at no more than its target).
PLD_COARSE_MAX_EPSILON = 10_000.0
PLD_FINE_WORK = 1e8
# The PLD of one release spans its privacy losses, about 1/z (Laplace) or 1/(2 z^2) (Gaussian) for the
# multiplier z, whether or not it is sampled: below these multipliers (an epsilon near 100 per release) it
# takes seconds to build (one Poisson-sampled Gaussian release of multiplier 0.02: 46 s), so neither a
# statement nor a single release's epsilon (:func:`single_release`) is computed from it.
PLD_MIN_MULTIPLIER = {"laplace": 0.01, "gaussian": 0.1}
ACCOUNTANTS = ("pld", "rdp")
MECHANISMS = ("laplace", "gaussian")


def clipped_sensitivity(clip: float, total: int, neighbouring: str, sampling: float = 1.0) -> float:
    """Sensitivity of a clipped mean gradient: 2C/I if one sample is replaced, C/I if added or removed;
    C/(qI) for the sum over a Poisson sample at rate q scaled by 1/(qI) (add-remove only).

    Replacing sample i changes sum_i clip(g_i) / I by the difference of two terms of norm
    <= C each; adding or removing changes it by one such term. (I is the public sample
    count.) In the L1 norm this is the Delta of eq. (9) of 003 for which its Theorem 1 holds
    as stated; in the L2 norm it is the Delta_2 of a Gaussian mechanism (002's c/n is the
    add-remove value).
    """
    return (2.0 if neighbouring == "replace-one" else 1.0) * clip / (sampling * total)


def relation() -> dp_accounting.NeighboringRelation:
    """The neighbouring relation of every accountant: add-or-remove-one, the one with the Laplace PLD (the
    module docstring says why this serves replace-one releases too)."""
    import dp_accounting

    return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def accountant(kind: str = "pld", interval: float = PLD_INTERVAL) -> dp_accounting.PrivacyAccountant:
    """A fresh dp-accounting accountant: PLD (discretised at ``interval``) or RDP, for :func:`relation`.

    Every epsilon of the project (the families' ledgers and the baselines') comes from one of these.
    """
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    if kind == "pld":
        return pld_privacy_accountant.PLDAccountant(relation(), value_discretization_interval=interval)
    if kind == "rdp":
        return rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation())
    raise ValueError(f"accountant={kind!r} is not allowed; choose one of {', '.join(ACCOUNTANTS)}")


# What a statement says of randomness before any run (dpadmm privacy); a run replaces it with what its agents
# used (dpadmm.privacy.randomness.statement).
NO_RUN = ("the guarantee describes the mechanism a deployment runs (each node's noise and samples from its "
          "own secret, the noise on a grid); a simulated run (on Flower's simulation engine or dpadmm's "
          "batched engine) keys them by the run's seed instead, so its transcript is reproducible from the "
          "run config")


@dataclass(frozen=True)
class Release:
    """One noisy release of one agent, as a DP event: the unit that ledgers compose.

    ``noise_multiplier`` is the noise scale over the sensitivity (Laplace b / Delta_1,
    Gaussian sigma / Delta_2); ``sampling`` is the probability with which each record enters
    the release independently (Poisson sampling; 1 = every record, no amplification).
    """

    mechanism: str
    noise_multiplier: float
    sampling: float = 1.0

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism={self.mechanism!r} is not allowed; choose one of "
                             f"{', '.join(MECHANISMS)}")
        if not 0 < self.noise_multiplier < math.inf:  # an infinite one is no noise anyone can draw
            raise ValueError(f"noise multiplier {self.noise_multiplier!r} is not allowed; it must be finite "
                             "and > 0")
        if not 0 < self.sampling <= 1:
            raise ValueError(f"sampling={self.sampling!r} is not allowed; it must be in (0, 1]")
        if self.mechanism == "gaussian" and self.noise_multiplier < MIN_GAUSSIAN_MULTIPLIER:
            raise ValueError(f"noise multiplier {self.noise_multiplier!r} is not allowed for the Gaussian "
                             "mechanism; it must be >= 2**-10 (the deployed sampler's accounting holds "
                             "there)")

    @property
    def deployed_multiplier(self) -> float:
        """The multiplier of the deployed grid mechanism: its rounding to the grid adds at most
        2**-GRID_BITS to the sensitivity over the noise scale (:mod:`dpadmm.privacy.secure`)."""
        return 1.0 / (1.0 / self.noise_multiplier + 2.0 ** -GRID_BITS)

    def event(self, count: int = 1) -> dp_accounting.DpEvent:
        """dp-accounting's event for ``count`` such releases composed (as deployed)."""
        import dp_accounting

        multiplier = self.deployed_multiplier
        if self.mechanism == "laplace":
            one: dp_accounting.DpEvent = dp_accounting.LaplaceDpEvent(noise_multiplier=multiplier)
        else:
            one = dp_accounting.GaussianDpEvent(noise_multiplier=multiplier)
        if self.sampling < 1:
            one = dp_accounting.PoissonSampledDpEvent(sampling_probability=self.sampling, event=one)
        return one if count == 1 else dp_accounting.SelfComposedDpEvent(one, count)


@dataclass(frozen=True)
class Guarantee:
    """(epsilon, delta) of ``releases`` composed releases, by four methods."""

    scope: str  # "step", "round" or "run"
    releases: int
    delta: float  # the delta every epsilon below is stated at
    # the number to quote: dp-accounting's PLD accountant, or where that is too slow what ``method`` says
    # (composed_epsilon); inf (null in JSON): no guarantee, and ``method`` says "no guarantee: " and why
    epsilon_pld: float
    epsilon_rdp: float  # dp-accounting's RDP accountant (nan where it has no bound: subsampled Laplace)
    epsilon_basic: float  # basic composition
    epsilon_advanced: float  # advanced composition (Dwork, Rothblum & Vadhan 2010)
    method: str = "PLD"  # how epsilon_pld was computed (composed_epsilon)


@dataclass(frozen=True)
class Ledger:
    """The privacy of one agent's releases in a run, with what it covers in words."""

    algorithm: str
    mechanism: str  # "laplace" or "gaussian"
    noise_multiplier: float  # noise scale / sensitivity of one release
    epsilon_bar: float  # the configured privacy parameter: 003's eps-bar per release, 002's whole-run target
    calibration: str  # how the noise was set ("clipped", "data-dependent", a theorem's name)
    sensitivity: str  # the bound Delta of one release, with its value where it is one number
    noise_scale: str  # the noise's scale (Laplace b) or standard deviation (Gaussian)
    covered: bool  # whether the sensitivity is a proven bound (not computed from the data)
    neighbouring: str
    steps_per_round: int  # releases per round
    rounds: int
    per_step: Guarantee
    per_round: Guarantee
    whole_run: Guarantee
    note: str
    holder: str = "per agent"  # whose records the guarantee is about: each agent's, or all of them
    # which randomness the run used (dpadmm.privacy.randomness.statement); by default none ran yet
    randomness: str = NO_RUN

    def to_dict(self) -> dict[str, Any]:
        """The ledger as JSON values: an epsilon an accountant has no bound for (nan) or no finite one (inf)
        is null, so that the JSON stays JSON (it has no NaN or Infinity)."""
        out = dataclasses.asdict(self)
        for scope in ("per_step", "per_round", "whole_run"):
            out[scope] = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                          for k, v in out[scope].items()}
        return out

    def summary(self) -> str:
        """A few lines a person reads at the end of a run: the whole run's (eps, delta) first, the figure to
        quote, then the run, a round and a step by every method (the parts are labelled as parts)."""
        lines = [
            f"privacy ({self.algorithm}, {self.mechanism} noise, {self.calibration} sensitivity, "
            f"neighbouring: {self.neighbouring}; {self.holder}, at delta={self.whole_run.delta:g}):",
            f"  {self.guarantee()}",
        ]
        for g in (self.whole_run, self.per_round, self.per_step):
            quoted = f"eps = {g.epsilon_pld:.4g} ({g.method})" if math.isfinite(g.epsilon_pld) else g.method
            lines.append(f"  per {g.scope:<10} ({g.releases} release{'s' if g.releases > 1 else ''}): "
                         f"{quoted}; basic {_shown(g.epsilon_basic)}, advanced {_shown(g.epsilon_advanced)}, "
                         f"RDP {_shown(g.epsilon_rdp)}")
        lines.append(f"  sensitivity {self.sensitivity}; noise {self.noise_scale}")
        lines.append(f"  {self.note}")
        lines.append(f"  randomness: {self.randomness}")
        return "\n".join(lines)

    def guarantee(self) -> str:
        """The one line that says which figure is the guarantee. A ledger prints an epsilon per step, per
        round and per run by four methods, and a paper's theorem (in the note) or a configured target may
        state another for the same noise (002's Theorem 1: eps = 0.05 where the PLD gives 0.0143): a reader
        must not have to guess which one to quote."""
        run = self.whole_run
        if not math.isfinite(run.epsilon_pld):
            return f"guarantee: none for the whole run ({run.method})"
        if not self.covered:
            return (f"guarantee: none: the statement does not cover this run (its note says why); eps = "
                    f"{run.epsilon_pld:.4g} at delta = {run.delta:g} for the whole run is nominal only")
        theorem = (", and the note's theorem is the paper's own, looser bound for the same noise"
                   if self.calibration.startswith("Theorem") else "")
        return (f"guarantee: eps = {run.epsilon_pld:.4g} at delta = {run.delta:g} for the whole run, "
                f"{self.holder}: the per-run figure below, the one to quote; the other methods' figures are "
                f"looser bounds, the per-step and per-round ones parts of the run{theorem}")


def _shown(epsilon: float) -> str:
    """An epsilon as a statement prints it: n/a where the method has no bound, none where it has no finite
    one."""
    if math.isnan(epsilon):
        return "n/a"
    return f"{epsilon:.4g}" if math.isfinite(epsilon) else "none (not finite)"


def _at(epsilon_at: Any, count: int, delta: float) -> float:
    """epsilon at delta of ``count`` deployed releases from ``epsilon_at``, an accountant's epsilon(delta)
    for the continuous mechanism they round: a ratio within e^(count GRID_RATIO) of each transcript's
    probability costs 2 count GRID_RATIO in epsilon and a factor e^(count GRID_RATIO) on delta, and the
    Gaussian's far tail count GRID_TAIL more delta (:mod:`dpadmm.privacy.secure`)."""
    eta = count * GRID_RATIO
    spendable = (delta - count * GRID_TAIL) * math.exp(-eta)
    if spendable <= 0:
        return math.inf
    epsilon = float(epsilon_at(spendable)) + 2.0 * eta
    # The argument for a Poisson-subsampled Gaussian holds up to epsilon 2**32, far past any meaningful one.
    return epsilon if epsilon <= 2.0**32 else math.inf


def pld_epsilon(release: Release, count: int, delta: float, interval: float = PLD_INTERVAL) -> float:
    """epsilon at delta of ``count`` composed releases, by the PLD accountant."""
    tracker = accountant("pld", interval)
    tracker.compose(release.event(count))
    return _at(tracker.get_epsilon, count, delta)


@functools.lru_cache(maxsize=4096)
def composed_epsilon(release: Release, count: int, delta: float) -> tuple[float, str]:
    """(epsilon at delta of ``count`` composed releases, the method that gave it): the PLD accountant where
    it answers in seconds (:func:`_pld_too_slow`; at :data:`CALIBRATION_INTERVAL` where the fast bound is
    above :data:`PLD_MAX_EPSILON` or the work above :data:`PLD_FINE_WORK`), else the smallest of the bounds
    that always do (:func:`fast_epsilon`). Each is a valid upper bound; the method is stated with the
    number. Where none is finite, (inf, "no guarantee: " and why). Remembered: a server asks it for the
    budget spent every round, a calibration for the statement it makes."""
    epsilon, method = fast_epsilon(release, count, delta)
    slow = _pld_too_slow(release, count, epsilon)
    if not slow:
        # The PLD is the tightest but for its discretisation, rounded up at every release: over very many
        # releases RDP can be tighter (1e6 sampled Gaussian ones: 1.45 against 2.12), and both are valid.
        coarse = epsilon > PLD_MAX_EPSILON or epsilon * count > PLD_FINE_WORK
        pld = pld_epsilon(release, count, delta, CALIBRATION_INTERVAL if coarse else PLD_INTERVAL)
        name = f"PLD at the coarser interval {CALIBRATION_INTERVAL:g}" if coarse else "PLD"
        epsilon, method = (pld, name) if pld <= epsilon else (epsilon, f"{method}, tighter than the "
                                                                         f"{name}'s {pld:.4g}")
    else:
        method += f"; the PLD accountant is too slow for {slow}"
    if math.isfinite(epsilon):
        return epsilon, method
    if count * GRID_TAIL >= delta:
        return math.inf, (f"no guarantee: at delta={delta:g} the deployed noise's far tails alone take "
                          f"{count} x 2**-64 = {count * GRID_TAIL:.3g} of delta; give a larger delta or "
                          "fewer releases")
    return math.inf, f"no guarantee: no bound on {count} such releases is finite at delta={delta:g}"


def fast_epsilon(release: Release, count: int, delta: float) -> tuple[float, str]:
    """(the smallest of the bounds that answer at once whatever the count, its name): exact for unsampled
    Gaussian releases (k Gaussians of multiplier z compose into one of multiplier z / sqrt(k)), pure
    composition for unsampled Laplace ones (k / z, at delta 0), basic composition (which past 10^11
    releases, where the grid's cost leaves the exact one no delta, beats advanced), the RDP accountant's
    (none for Poisson-sampled Laplace releases), and advanced composition."""
    import dp_accounting

    bounds = [(rdp_epsilon(release, count, delta), "RDP")]
    if release.sampling == 1 and release.mechanism == "gaussian":
        multiplier = release.deployed_multiplier / math.sqrt(count)
        bounds.append((_at(lambda d: dp_accounting.get_epsilon_gaussian(multiplier, d), count, delta),
                       f"exact: {count} Gaussian releases are one Gaussian"))
    if release.sampling == 1 and release.mechanism == "laplace":
        bounds.append((basic_composition(single_release(release, 0.0), count), "pure composition"))
    bounds.append((basic_composition(single_release(release, delta / count), count), "basic composition"))
    bounds.append((advanced_composition(single_release(release, delta / (2 * count)), count, delta / 2),
                   "advanced composition"))
    return min((b for b in bounds if not math.isnan(b[0])), key=lambda b: b[0])


def _pld_too_slow(release: Release, count: int, fast: float) -> str:
    """Why the PLD accountant is not asked for ``count`` such releases whose fast bound is ``fast`` (the
    module constants say what takes it minutes); empty where it answers in seconds."""
    if count > PLD_MAX_RELEASES:
        return f"more than {PLD_MAX_RELEASES} releases"
    if fast > PLD_COARSE_MAX_EPSILON:
        return f"an epsilon above {PLD_COARSE_MAX_EPSILON:g}"
    if release.noise_multiplier < PLD_MIN_MULTIPLIER[release.mechanism]:
        return f"a multiplier below {PLD_MIN_MULTIPLIER[release.mechanism]:g}"
    return ""


@functools.lru_cache(maxsize=256)
def rdp_epsilon(release: Release, count: int, delta: float) -> float:
    """epsilon at delta of ``count`` composed releases, by the RDP accountant; nan for a Poisson-sampled
    Laplace release, for which dp-accounting's RDP accountant has no bound."""
    if release.mechanism == "laplace" and release.sampling < 1:
        return math.nan
    tracker = accountant("rdp")
    with _accountant_warnings_silenced():
        tracker.compose(release.event(count))  # the terms are computed here
        return _at(tracker.get_epsilon, count, delta)


@contextlib.contextmanager
def _accountant_warnings_silenced() -> Iterator[None]:
    """dp-accounting warns, through absl, for every order whose sampled-Gaussian term it cannot compute
    and leaves out (the bound stays valid over the others): five lines per call for q = 0.1 and sigma
    near 1. They are silenced, and so is absl's side effect: its log() calls logging.basicConfig() when
    the root logger has no handler, which would print every later line of the process twice (Flower's
    logger propagates to the root). A NullHandler on the root for the duration prevents that."""
    absl, guard = logging.getLogger("absl"), logging.NullHandler()
    level = absl.level
    absl.setLevel(logging.ERROR)
    logging.root.addHandler(guard)
    try:
        yield
    finally:
        logging.root.removeHandler(guard)
        absl.setLevel(level)


@functools.lru_cache(maxsize=16)  # a few: each holds a distribution of up to millions of points
def _one_release_pld(release: Release) -> dp_accounting.PrivacyAccountant:
    """The PLD accountant of one release, built once and asked at every delta a ledger needs."""
    tracker = accountant("pld")
    tracker.compose(release.event(1))
    return tracker


def _amplified(epsilon: float, sampling: float) -> float:
    """log(1 + q (e^eps - 1)), written so that it neither overflows nor cancels."""
    if epsilon < 1:
        return math.log1p(sampling * math.expm1(epsilon))
    return epsilon + math.log(sampling + (1 - sampling) * math.exp(-epsilon))


@functools.lru_cache(maxsize=1024)
def single_release(release: Release, delta: float) -> float:
    """epsilon of one release at delta: 1/multiplier for unsampled Laplace (pure DP, delta = 0: the discrete
    Laplace's ratio is exactly that), exact for unsampled Gaussian, the PLD accountant's for a sampled one
    (amplification by sampling of the unsampled one's below :data:`PLD_MIN_MULTIPLIER`, where that PLD is
    too slow to build); all of the deployed mechanism. Remembered: a ledger asks it at a few deltas."""
    if release.sampling < 1 and release.noise_multiplier >= PLD_MIN_MULTIPLIER[release.mechanism]:
        return _at(_one_release_pld(release).get_epsilon, 1, delta)
    if release.sampling < 1:
        # amplification by Poisson sampling, for one record added or removed (Balle, Barthe & Gaboardi
        # 2018, Thm. 8): an (eps, d)-DP release read from a q-sample is (log(1 + q (e^eps - 1)), q d)-DP;
        # d <= delta / q (at most 1/2: a smaller d is valid too) spends at most delta
        return _amplified(single_release(dataclasses.replace(release, sampling=1.0),
                                         min(delta / release.sampling, 0.5)), release.sampling)
    if release.mechanism == "laplace":
        return 1.0 / release.deployed_multiplier
    import dp_accounting
    import numpy as np

    # Its search evaluates log(e^x - e^y) at y = x, where -inf is the right value; NumPy would print a
    # divide-by-zero RuntimeWarning into the user's terminal for it.
    with np.errstate(divide="ignore"):
        return _at(lambda d: dp_accounting.get_epsilon_gaussian(release.deployed_multiplier, d), 1, delta)


def basic_composition(epsilon: float, releases: int) -> float:
    """k eps: the k-fold composition of eps-DP releases (delta adds up likewise)."""
    return releases * epsilon


def advanced_composition(epsilon: float, releases: int, delta_prime: float) -> float:
    """sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1): k-fold (eps, delta0) releases are
    (that, k delta0 + delta')-DP (Dwork, Rothblum & Vadhan 2010; Dwork & Roth Thm. 3.20)."""
    k = releases
    if epsilon > 700:  # e^eps overflows a float: no finite bound
        return math.inf
    return math.sqrt(2 * k * math.log(1 / delta_prime)) * epsilon + k * epsilon * math.expm1(epsilon)


def guarantee(scope: str, release: Release, count: int, delta: float) -> Guarantee:
    """The four epsilons of ``count`` composed releases at ``delta``."""
    if release.mechanism == "laplace" and release.sampling == 1:  # pure: all of delta to the composition
        eps0 = single_release(release, 0.0)
        basic = basic_composition(eps0, count)
        advanced = advanced_composition(eps0, count, delta)
    else:  # (eps0, delta0) releases: split delta between the releases and the composition
        basic = basic_composition(single_release(release, delta / count), count)
        eps0 = single_release(release, delta / (2 * count))
        advanced = advanced_composition(eps0, count, delta / 2)
    quoted, method = composed_epsilon(release, count, delta)
    return Guarantee(
        scope=scope, releases=count, delta=delta, epsilon_pld=quoted,
        epsilon_rdp=rdp_epsilon(release, count, delta),
        epsilon_basic=basic, epsilon_advanced=advanced, method=method,
    )


def ledger(*, algorithm: str, release: Release, per_round: int, rounds: int, delta: float, epsilon_bar: float,
           calibration: str, sensitivity: str, noise_scale: str, covered: bool, neighbouring: str,
           note: str, holder: str = "per agent") -> Ledger:
    """The ledger of an agent (``holder`` says whose records) that makes ``per_round`` releases a round
    for ``rounds`` rounds."""
    return Ledger(
        algorithm=algorithm, mechanism=release.mechanism, noise_multiplier=release.noise_multiplier,
        epsilon_bar=epsilon_bar, calibration=calibration, sensitivity=sensitivity, noise_scale=noise_scale,
        covered=covered, neighbouring=neighbouring, steps_per_round=per_round, rounds=rounds,
        per_step=guarantee("step", release, 1, delta),
        per_round=guarantee("round", release, per_round, delta),
        whole_run=guarantee("run", release, per_round * rounds, delta),
        note=note, holder=holder,
    )


# Noise multipliers searched by the calibration (Laplace: eps-bar from 1e-7 to 20 per release;
# dp-accounting's PLD breaks down for multipliers near 1e-3).
MULTIPLIER_RANGE = (0.05, 1e7)


def calibrate_multiplier(mechanism: str, count: int, target_epsilon: float, delta: float,
                         sampling: float = 1.0) -> float:
    """The noise multiplier for which ``count`` composed releases are ``target_epsilon``-DP at ``delta``.

    Where the statement would not ask the PLD accountant (more than :data:`PLD_MAX_RELEASES` releases, a
    target above :data:`PLD_MAX_EPSILON`), inverts the fast bound (:func:`fast_epsilon`), which the
    statement never exceeds, in seconds whatever the count. Otherwise inverts the PLD accountant
    (discretised at :data:`CALIBRATION_INTERVAL`, so the result meets its target), and checks the statement
    of the result (:func:`composed_epsilon`) against the target, raising the multiplier where it does not
    meet it (:func:`_as_stated`). Over many releases the coarse PLD's rounding up at every release makes
    the calibration cautious (1e6 sampled Gaussian releases calibrated to 8 would be stated at 2.1; they
    are calibrated on the fast bound). Raises ValueError, naming the reachable range, when the target lies
    outside what multipliers in :data:`MULTIPLIER_RANGE` give.
    """
    def release(multiplier: float) -> Release:
        return Release(mechanism, multiplier, sampling)

    fast = count > PLD_MAX_RELEASES or target_epsilon > PLD_MAX_EPSILON

    def epsilon(multiplier: float) -> float:
        if fast:
            return fast_epsilon(release(multiplier), count, delta)[0]
        return pld_epsilon(release(multiplier), count, delta, CALIBRATION_INTERVAL)
    low, high = MULTIPLIER_RANGE
    floor = epsilon(high)
    if math.isinf(floor):
        raise ValueError(f"target-epsilon={target_epsilon:g} is not achievable with {count} releases at "
                         f"delta={delta:g}: no noise gives a finite epsilon there ("
                         + composed_epsilon(release(high), count, delta)[1].removeprefix("no guarantee: ")
                         + ")")
    # A sampled release with the largest multiplier has an epsilon below the discretisation (0): the
    # accountant cannot tell targets below its interval apart, so they are refused, not met in name only.
    smallest = floor if floor > 0 else CALIBRATION_INTERVAL
    if target_epsilon < smallest:
        raise ValueError(f"target-epsilon={target_epsilon:g} is not achievable with {count} "
                         f"releases at delta={delta:g}; the smallest achievable value is {smallest:.4g}"
                         + ("" if floor > 0 else " (the accountant's resolution)"))
    # Bracket the root: step the multiplier down from the largest, 8x at a time, to the first whose epsilon
    # reaches the target. A PLD is the slower to build the smaller its multiplier (Gaussian at 0.05: ~10 s)
    # and brentq evaluates both ends of its bracket, so the small end of the range is reached only if needed.
    bracket, ceiling = (high, high), floor
    while ceiling < target_epsilon and bracket[0] > low:
        bracket = (max(bracket[0] / 8, low), bracket[0])
        ceiling = epsilon(bracket[0])
    if target_epsilon > ceiling:
        raise ValueError(f"target-epsilon={target_epsilon:g} needs more than {1 / low:g} per "
                         f"release ({count} releases give {ceiling:.4g} there); ask for less, or set "
                         "epsilon directly")
    if fast:
        return _smallest_meeting(lambda m: epsilon(m) <= target_epsilon, *bracket, 1e-4)
    import dp_accounting

    calibrated = float(dp_accounting.calibrate_dp_mechanism(
        lambda: accountant("pld", CALIBRATION_INTERVAL),
        lambda m: release(m).event(count),
        target_epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(*bracket), tol=1e-4,
    ))
    return _as_stated(release, calibrated, count, target_epsilon, delta)


def _as_stated(release: Callable[[float], Release], multiplier: float, count: int, target_epsilon: float,
               delta: float) -> float:
    """``multiplier``, or a larger one (within 1% of the smallest) whose statement meets the target.

    The statement (:func:`composed_epsilon`) need not use the calibration's accountant where the PLD is too
    slow for it (a fast bound above :data:`PLD_COARSE_MAX_EPSILON`, a multiplier below
    :data:`PLD_MIN_MULTIPLIER`): its looser bound can lie above the target. Nor is the grid's cost in
    dp-accounting's number. The multiplier is then raised, by 1%, 2%, 4%, ... and bisected, until the
    statement meets the target.
    """
    def meets(m: float) -> bool:
        return composed_epsilon(release(m), count, delta)[0] <= target_epsilon

    low, high, step = multiplier, multiplier, 1.01
    while not meets(high):
        if high >= MULTIPLIER_RANGE[1]:
            raise ValueError(f"target-epsilon={target_epsilon:g} is not achievable with {count} releases at "
                             f"delta={delta:g}: the statement gives "
                             f"{composed_epsilon(release(high), count, delta)[0]:.4g} at the largest "
                             f"multiplier searched, {high:g}")
        low, high, step = high, min(multiplier * step, MULTIPLIER_RANGE[1]), step * step
    return high if high == multiplier else _smallest_meeting(meets, low, high, 1e-2)


def _smallest_meeting(meets: Callable[[float], bool], low: float, high: float, tolerance: float) -> float:
    """A multiplier in (low, high] that meets, within a factor 1 + ``tolerance`` of the smallest that does,
    where ``meets`` holds at ``high`` and turns true once (a larger multiplier, less epsilon): bisection
    on the logarithm."""
    while high > low * (1 + tolerance):
        middle = math.sqrt(low * high)
        low, high = (low, middle) if meets(middle) else (middle, high)
    return high
