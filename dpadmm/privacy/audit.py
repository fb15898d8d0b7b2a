"""Privacy auditing: an attack's outcomes as an epsilon lower bound that holds with confidence 1 - alpha.

A differentially private release M satisfies P[M(D) in S] <= e^eps P[M(D') in S] + delta for every pair of
neighbours (D, D') in either order and every set S. An attack that observes M on D in some trials and on D' in
others, and tests "output in S" for an S fixed before it looks, estimates both probabilities; Clopper-Pearson
intervals make the ratio a bound, eps >= ln((p_low - delta) / p'_high), that a correct mechanism exceeds with
probability at most alpha (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021). An audit is only as strong as
its neighbours and its test: the families' attacks (``dpadmm.<family>.audit``) pick the worst-case neighbours
their sensitivity allows and the attacker's most informative statistic, so that the bound can approach the
claim; the claim itself comes from the ledger, not from here.

Two designs share this module:

* :func:`threshold_audit`, many trials of one release each (the release of one step or one message). The
  attacker reduces each output to a score and tests "score beyond tau". The threshold and the direction are
  chosen on a calibration share of the trials and the bound is computed on the rest, so that the one test
  evaluated was fixed before its data was seen.
* :func:`one_run_audit`, one training run with many canaries (Steinke, Nasr & Jagielski, "Privacy Auditing
  with One (1) Training Run", NeurIPS 2023): each of m canaries is included independently with probability
  1/2, the attacker guesses "in" for the k highest scores and "out" for the k lowest, and the count of right
  guesses is tested against what an (eps, delta)-DP run allows (their bound for approximate DP):
  :func:`one_run_p_value`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import beta, binom

ALPHA = 0.05  # the audits' default confidence is 95%
CALIBRATION_SHARE = 0.1  # of the trials, spent choosing the test of a threshold audit
CANDIDATE_THRESHOLDS = 512  # thresholds tried on the calibration share (its quantiles)
MIN_CALIBRATION_HITS = 30  # calibration outputs a candidate test needs in it, of D and of D' (or none of D')


@dataclass(frozen=True)
class AuditResult:
    """What an audit of one kind of release found, next to what the ledger claims for it.

    ``claim`` is the epsilon the ledger states for one such release, at ``delta`` (0 for a pure claim);
    ``bound`` the empirical lower bound, which a correct implementation exceeds with probability at most
    ``alpha``. A bound above the claim means that the release leaks more than the claim allows.
    """

    kind: str  # the release attacked, in words
    claim: float
    delta: float
    bound: float
    trials: int  # independent releases observed (a one-run audit: canaries)
    seconds: float
    alpha: float = ALPHA
    attack: str = ""  # the neighbours and the test, in words
    detail: dict[str, Any] = field(default_factory=dict)  # rates, threshold, guesses: what the bound rests on

    @property
    def exceeded(self) -> bool:
        """Whether the bound lies above the claim: the audit refutes it (at confidence 1 - alpha)."""
        return self.bound > self.claim

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "claim": self.claim, "delta": self.delta, "bound": self.bound,
                "trials": self.trials, "seconds": self.seconds, "alpha": self.alpha, "attack": self.attack,
                "exceeded": self.exceeded, **self.detail}

    def line(self) -> str:
        """One line a person reads: the claim, the bound and the share of the claim the bound reaches."""
        share = f"{self.bound / self.claim:.0%} of the claim" if self.claim > 0 else "no claim"
        verdict = "EXCEEDS THE CLAIM" if self.exceeded else share
        at = f" at delta={self.delta:g}" if self.delta else " (pure)"
        return (f"{self.kind}: claim eps = {self.claim:.4g}{at}; audit lower bound {self.bound:.4g} "
                f"({verdict}; {self.trials:,} trials, {1 - self.alpha:.0%} confidence, {self.seconds:.1f} s)")


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one: what an audit's kind says of a run's length."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval of a binomial proportion."""
    low = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return low, high


def epsilon_lower_bound(hits: int, trials: int, hits_prime: int, trials_prime: int, delta: float = 0.0,
                        alpha: float = ALPHA) -> float:
    """ln((p_low - delta) / p'_high) for one test S fixed beforehand: ``hits`` of ``trials`` outputs on D fell
    in S, ``hits_prime`` of ``trials_prime`` on D'. Each rate's one-sided bound is at level alpha / 2, so that
    both hold together with probability 1 - alpha. 0 where the rates prove nothing."""
    p_low, _ = clopper_pearson(hits, trials, alpha)
    _, pp_high = clopper_pearson(hits_prime, trials_prime, alpha)
    if p_low - delta <= 0:
        return 0.0
    return max(math.log((p_low - delta) / pp_high), 0.0)


def _tail_counts(sorted_scores: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(#scores >= tau, #scores <= tau) for each tau, from scores sorted ascending."""
    at_least = sorted_scores.size - np.searchsorted(sorted_scores, thresholds, side="left")
    at_most = np.searchsorted(sorted_scores, thresholds, side="right")
    return at_least, at_most


STATISTICS = ("projection", "laplace")


def release_audit(outputs: np.ndarray, outputs_prime: np.ndarray, statistic: str, delta: float = 0.0,
                  alpha: float = ALPHA, calibration: float = CALIBRATION_SHARE
                  ) -> tuple[float, dict[str, Any]]:
    """The epsilon lower bound of a threshold test on the attacker's statistic of each release.

    ``outputs`` [trials, d] are releases on D, ``outputs_prime`` on D', each row from its own noise. The
    first ``calibration`` share of each fits the statistic, an estimate of the log-likelihood ratio, and
    chooses the test (:func:`threshold_audit`); the one test chosen is evaluated on the remaining trials, so
    that the bound holds whatever the calibration found. The attacker needs no formula of the release:
    ``projection`` (Gaussian noise of one scale on both, or a Poisson-sampled shift of it) projects onto the
    difference of the two means, each coordinate weighted by its inverse variance, which is monotone in the
    likelihood ratio of both; ``laplace`` sums each coordinate's Laplace log-likelihood ratio with the
    centres (medians) and scales (mean absolute deviations) of each data set, which also catches a noise
    scale that depends on the data.
    """
    outputs, outputs_prime = _rows(outputs), _rows(outputs_prime)
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r} is not allowed; choose one of {', '.join(STATISTICS)}")
    cut, cut_prime = int(outputs.shape[0] * calibration), int(outputs_prime.shape[0] * calibration)
    if min(cut, cut_prime, outputs.shape[0] - cut, outputs_prime.shape[0] - cut_prime) < 2:
        raise ValueError(f"{outputs.shape[0]} and {outputs_prime.shape[0]} trials are too few to calibrate "
                         f"on {calibration:.0%} of them and evaluate on the rest")
    fitted, fitted_prime = outputs[:cut], outputs_prime[:cut_prime]
    if statistic == "projection":
        scale = np.sqrt((fitted.var(axis=0) + fitted_prime.var(axis=0)) / 2)
        scale = np.where(scale > 0, scale, 1.0)
        weight = (fitted.mean(axis=0) - fitted_prime.mean(axis=0)) / scale**2
        centre = (fitted.mean(axis=0) + fitted_prime.mean(axis=0)) / 2

        def score(rows: np.ndarray) -> np.ndarray:
            return (rows - centre) @ weight
    else:
        middle, middle_prime = np.median(fitted, axis=0), np.median(fitted_prime, axis=0)
        spread = np.maximum(np.abs(fitted - middle).mean(axis=0), np.finfo(np.float64).tiny)
        spread_prime = np.maximum(np.abs(fitted_prime - middle_prime).mean(axis=0), np.finfo(np.float64).tiny)
        offset = float(np.log(spread_prime / spread).sum())

        def score(rows: np.ndarray) -> np.ndarray:
            ratio = np.abs(rows - middle_prime) / spread_prime - np.abs(rows - middle) / spread
            return ratio.sum(axis=1) + offset
    bound, detail = threshold_audit(score(fitted), score(fitted_prime), score(outputs[cut:]),
                                    score(outputs_prime[cut_prime:]), delta, alpha)
    return bound, {**detail, "statistic": statistic, "calibration_trials": cut + cut_prime}


def _rows(outputs: np.ndarray) -> np.ndarray:
    """Releases as a [trials, d] float64 array; one that is not finite is refused (it proves nothing)."""
    rows = np.asarray(outputs, dtype=np.float64)
    rows = rows.reshape(rows.shape[0], -1)
    if not np.isfinite(rows).all():
        raise ValueError("the releases under audit contain values that are not finite")
    return rows


def threshold_audit(calibration: np.ndarray, calibration_prime: np.ndarray, scores: np.ndarray,
                    scores_prime: np.ndarray, delta: float = 0.0, alpha: float = ALPHA
                    ) -> tuple[float, dict[str, Any]]:
    """The epsilon lower bound of the best test "score >= tau" or "score <= tau", in either order of (D, D').

    The calibration scores (on D, on D') choose, among their quantiles and tails, both directions and both
    orders, the test whose Clopper-Pearson bound is largest there (:func:`_choose_test`); that one test is
    then evaluated on ``scores`` (D) and ``scores_prime`` (D'), trials the choice never saw. Returns the bound
    and what it rests on.
    """
    scale = (scores.size + scores_prime.size) / (calibration.size + calibration_prime.size)
    direction, first, tau = _choose_test(np.sort(calibration), np.sort(calibration_prime), delta, alpha,
                                         scale)
    evaluate = (np.sort(scores), np.sort(scores_prime))
    if first == "D'":
        evaluate = evaluate[::-1]
    side = 0 if direction == ">=" else 1
    hits, hits_prime = (int(_tail_counts(s, np.array([tau]))[side][0]) for s in evaluate)
    trials, trials_prime = evaluate[0].size, evaluate[1].size
    bound = epsilon_lower_bound(hits, trials, hits_prime, trials_prime, delta, alpha)
    return bound, {"test": f"score {direction} {tau:.6g}, {first} first", "p": hits / trials,
                   "p_prime": hits_prime / trials_prime}


def _choose_test(scores: np.ndarray, scores_prime: np.ndarray, delta: float, alpha: float, scale: float
                 ) -> tuple[str, str, float]:
    """(direction, which data set plays D, tau) of the best bound on the (sorted) calibration scores.

    The candidates are the pooled scores' quantiles and, because the best test of a small epsilon-delta often
    sits far in a tail, the scores of geometrically spaced ranks from either end. Each is judged by the bound
    its calibration rates would give on ``scale`` times as many trials (the evaluation's): a rate seen a few
    times in the calibration share is seen ``scale`` times as often in the evaluation.
    """
    pooled = np.sort(np.concatenate([scores, scores_prime]))
    ranks = np.unique(np.geomspace(1, pooled.size, 256).astype(np.int64)) - 1
    thresholds = np.unique(np.concatenate([np.quantile(pooled, np.linspace(0.0, 1.0, CANDIDATE_THRESHOLDS)),
                                           pooled[ranks], pooled[::-1][ranks]]))
    tails = {"D": _tail_counts(scores, thresholds), "D'": _tail_counts(scores_prime, thresholds)}
    sizes = {"D": scores.size, "D'": scores_prime.size}
    best, chosen = -np.inf, (">=", "D", float(thresholds[0]))
    for first, second in (("D", "D'"), ("D'", "D")):
        for side, direction in enumerate((">=", "<=")):
            hits, hits_prime = tails[first][side] * scale, tails[second][side] * scale
            n, n_prime = sizes[first] * scale, sizes[second] * scale
            with np.errstate(divide="ignore", invalid="ignore"):
                low = np.where(hits > 0, beta.ppf(alpha / 2, np.maximum(hits, 1e-12), n - hits + 1), 0.0)
                high = np.where(hits_prime < n_prime, beta.ppf(1 - alpha / 2, hits_prime + 1,
                                                               np.maximum(n_prime - hits_prime, 1e-12)), 1.0)
                value = np.log(np.maximum(low - delta, 0.0) / high)
            # a tail seen a few times in the calibration share is luck as often as not, and would win; none of
            # D' in a tail that many of D fell in is no luck (a correct mechanism puts e^-eps of them there)
            counts, counts_prime = tails[first][side], tails[second][side]
            seen = (counts >= MIN_CALIBRATION_HITS) & (
                (counts_prime >= MIN_CALIBRATION_HITS) | (counts_prime == 0))
            value = np.where(seen, value, -np.inf)
            i = int(np.argmax(value))
            if value[i] > best:
                best, chosen = float(value[i]), (direction, first, float(thresholds[i]))
    return chosen


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """P[at least ``correct`` right of ``guesses``] for a run that is (epsilon, delta)-DP in each canary's
    inclusion (Steinke, Nasr & Jagielski 2023, their bound for approximate DP): a Binomial(r, e^eps /
    (1 + e^eps)) tail, plus, for delta > 0, 2 m delta times the largest i^-1 P[v - i <= Binomial < v] over
    i = 1..v."""
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"correct={correct}, guesses={guesses}, canaries={canaries}: need "
                         "0 <= correct <= guesses <= canaries")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(correct - 1, guesses, q))
    if delta == 0 or correct == 0:
        return tail
    below = binom.pmf(np.arange(correct - 1, -1, -1), guesses, q).cumsum()  # i = 1..v: P[v-i <= B < v]
    spread = float(np.max(below / np.arange(1, correct + 1)))
    return min(tail + 2 * canaries * delta * spread, 1.0)


def one_run_bound(canaries: int, guesses: int, correct: int, delta: float = 0.0, alpha: float = ALPHA
                  ) -> float:
    """The largest epsilon that ``correct`` right of ``guesses`` refutes at level alpha (0 if none): the
    p-value of :func:`one_run_p_value` grows with epsilon, so the boundary is found by bisection."""
    if one_run_p_value(canaries, guesses, correct, 0.0, delta) > alpha:
        return 0.0
    low, high = 0.0, 1.0
    while one_run_p_value(canaries, guesses, correct, high, delta) <= alpha:
        low, high = high, 2 * high
        if high > 1e3:
            return low
    while high - low > 1e-6 * max(high, 1.0):
        middle = (low + high) / 2
        refuted = one_run_p_value(canaries, guesses, correct, middle, delta) <= alpha
        low, high = (middle, high) if refuted else (low, middle)
    return low


def one_run_audit(scores: np.ndarray, included: np.ndarray, delta: float = 0.0, alpha: float = ALPHA,
                  guesses: tuple[int, ...] = ()) -> tuple[float, dict[str, Any]]:
    """The one-run bound from each canary's score and whether it was included: guess "in" for the k highest
    scores and "out" for the k lowest, for each 2k in ``guesses`` (default: a few shares of m), and keep the
    best bound, each at level alpha / len(guesses) so that the best holds at level alpha (Bonferroni)."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    m = scores.size
    if included.shape != scores.shape or m < 2:
        raise ValueError(f"{m} canary scores and {included.size} inclusion flags: need the same number, >= 2")
    guesses = guesses or tuple(sorted({max(2, 2 * int(m * s / 2)) for s in (0.02, 0.1, 0.3, 1.0)}))
    order = np.argsort(scores, kind="stable")
    best, detail = 0.0, {"canaries": m}
    for r in guesses:
        k = r // 2
        correct = int(included[order[m - k:]].sum() + (~included[order[:k]]).sum())
        value = one_run_bound(m, 2 * k, correct, delta, alpha / len(guesses))
        if value >= best:
            best, detail = value, {"canaries": m, "guesses": 2 * k, "correct": correct}
    return best, detail



def one_run_result(kind: str, scores: np.ndarray, included: np.ndarray, claim: float, delta: float,
                   began: float, alpha: float, attack: str) -> AuditResult:
    """A whole run audited from one run: :func:`one_run_audit` of the canaries' ``scores`` and inclusion
    flags, beside the ledger's whole-run ``claim`` at ``delta``; ``began`` is the audit's start
    (``time.perf_counter``). The families' ``one_run`` differ in their canaries and scores, not here."""
    bound, detail = one_run_audit(scores, included, delta, alpha)
    return AuditResult(kind=f"{kind}, one run with canaries", claim=claim, delta=delta, bound=bound,
                       trials=int(np.asarray(scores).size), seconds=time.perf_counter() - began, alpha=alpha,
                       attack=attack, detail=detail)


def shown(rounds: int, unit: str) -> Iterator[int]:
    """1..``rounds``, with a progress bar on stderr when it is a terminal: a whole-run audit runs every round
    of the run it audits (10^8 rounds take days) and must not look hung."""
    from dpadmm.runs.results import progress_bar

    bar = progress_bar(rounds, sys.stderr.isatty(), unit=unit)
    try:
        for t in range(1, rounds + 1):
            yield t
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
