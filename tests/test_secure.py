"""Tests of dpadmm.privacy.secure: the ChaCha20 stream, key derivation, the exact samplers, the grid releases.

Statistical tests use fixed keys, so they are deterministic; each compares with the exact distribution
(chi-square, Kolmogorov-Smirnov or binomial tests) and fails for a sampler that is off by a few per cent.
"""

from __future__ import annotations

import decimal
import math
import subprocess
import sys
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import scipy.stats
import torch

from dpadmm.privacy import secure

KEY = bytes(range(32))
P_MIN = 1e-4  # smallest p-value a goodness-of-fit test may give


def stream(*parts: str | int) -> secure.Stream:
    return secure.Stream(secure.derive(KEY, "tests", *parts))


class Scripted(secure.Stream):
    """A stream that returns given words (then fails), to drive a sampler down a chosen path."""

    def __init__(self, words: list[int]) -> None:  # no ChaCha20 state
        self._left = [np.uint64(w) for w in words]

    def words(self, n: int) -> np.ndarray:
        assert n <= len(self._left), f"asked for {n} words, {len(self._left)} scripted"
        out, self._left = self._left[:n], self._left[n:]
        return np.array(out, dtype=np.uint64)


def chi2_binned(samples: np.ndarray, edges: np.ndarray, probs: np.ndarray) -> float:
    """p-value of samples falling into bins [edges[i], edges[i+1]) with the given probabilities."""
    counts = np.bincount(np.searchsorted(edges, samples, side="right") - 1, minlength=len(probs))
    assert counts.size == len(probs), "a sample fell outside the bins"
    expected = probs / probs.sum() * samples.size
    assert expected.min() >= 5
    return float(scipy.stats.chisquare(counts, expected).pvalue)


def chi2_pmf(samples: np.ndarray, ks: np.ndarray, pmf: np.ndarray, min_expected: float = 40.0) -> float:
    """Chi-square against a pmf on consecutive integers ks (the tails beyond go to the end bins)."""
    pmf = pmf / pmf.sum()
    n = samples.size
    edges, acc = [ks[0]], 0.0
    probs = []
    for k, p in zip(ks, pmf, strict=True):
        acc += p
        if acc * n >= min_expected:
            edges.append(k + 1)
            probs.append(acc)
            acc = 0.0
    probs[-1] += acc
    edges[-1] = ks[-1] + 1
    edges_arr = np.array(edges, dtype=np.float64)
    edges_arr[0], edges_arr[-1] = -np.inf, np.inf
    return chi2_binned(samples.astype(np.float64), edges_arr, np.array(probs))


# --------------------------------------------------------------------------- stream and keys


def test_chacha20_known_answer() -> None:
    # RFC 8439, appendix A.1, test vector #1: all-zero key and nonce, block counter 0.
    expected = bytes.fromhex(
        "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
        "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586")
    words = secure.Stream(bytes(32)).words(8)
    assert words.dtype == np.uint64 and words.shape == (8,)
    assert words.astype("<u8").tobytes() == expected


def test_stream_is_the_same_however_the_reads_are_split() -> None:
    whole = stream(1).words(1000)
    s = stream(1)
    parts = [s.words(k) for k in (1, 0, 7, 64, 300, 628)]
    assert np.array_equal(np.concatenate(parts), whole)
    assert not np.array_equal(stream(2).words(1000), whole)
    # reads longer than the shared buffer of zeros are encrypted in pieces: the same words
    big = 2 * secure._ZERO_WORDS + 5
    whole = stream(3).words(big)
    s = stream(3)
    parts = [s.words(k) for k in (secure._ZERO_WORDS - 1, secure._ZERO_WORDS + 3, 3)]
    assert np.array_equal(np.concatenate(parts), whole)
    assert whole.flags.writeable and parts[0].flags.writeable
    assert not np.array_equal(secure.Stream(bytes(31) + b"\x01").words(4), secure.Stream(bytes(32)).words(4))


def test_stream_refuses_bad_keys() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        secure.Stream(bytes(16))
    with pytest.raises(TypeError):
        secure.Stream("0" * 32)  # type: ignore[arg-type]
    assert secure.Stream(bytearray(32)).words(1)[0] == secure.Stream(bytes(32)).words(1)[0]


def test_new_key() -> None:
    a, b = secure.new_key(), secure.new_key()
    assert isinstance(a, bytes) and len(a) == secure.KEY_BYTES == 32
    assert a != b


def test_derive_is_deterministic_and_unambiguous() -> None:
    key = secure.derive(KEY, "x", 1)
    assert len(key) == 32 and key == secure.derive(KEY, "x", 1)
    cases = [(), ("ab", "c"), ("a", "bc"), ("abc",), (1,), ("1",), (b"\x01",), (1, 2), (2, 1), (12,),
             (b"",), ("",), ("", ""), (0,), (2**64 - 1,), (b"ab", "c"), ("dpadmm-draw", 0, 0, 0, 0)]
    keys = {secure.derive(KEY, *parts) for parts in cases}
    assert len(keys) == len(cases)
    assert secure.derive(KEY, "x") != secure.derive(bytes(32), "x")
    assert secure.derive(KEY, np.int64(5)) == secure.derive(KEY, 5)


def test_derive_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        secure.derive(KEY[:31], "x")
    with pytest.raises(ValueError, match="2\\*\\*64"):
        secure.derive(KEY, 2**64)
    with pytest.raises(ValueError):
        secure.derive(KEY, -1)
    with pytest.raises(TypeError):
        secure.derive(KEY, True)
    with pytest.raises(TypeError):
        secure.derive(KEY, 1.5)  # type: ignore[arg-type]


def test_draw_stream_keys_each_draw_coordinate() -> None:
    got = secure.draw_stream(KEY, 3, 7, 2, 1).words(16)
    assert np.array_equal(got, secure.Stream(secure.derive(KEY, "dpadmm-draw", 3, 7, 2, 1)).words(16))
    others = [(4, 7, 2, 1), (3, 8, 2, 1), (3, 7, 3, 1), (3, 7, 2, 0)]
    for coords in others:
        assert not np.array_equal(secure.draw_stream(KEY, *coords).words(16), got)
    assert not np.array_equal(secure.draw_stream(bytes(32), 3, 7, 2, 1).words(16), got)


# --------------------------------------------------------------------------- uniform integers, bits, uniforms


@pytest.mark.parametrize("bound", [2, 7, 64, 1000])
def test_uniform_below_is_uniform(bound: int) -> None:
    x = secure.uniform_below(stream("below", bound), 100_000, bound)
    assert x.dtype == np.int64 and x.shape == (100_000,)
    assert x.min() >= 0 and x.max() < bound
    counts = np.bincount(x, minlength=bound)
    assert scipy.stats.chisquare(counts).pvalue > P_MIN


@pytest.mark.parametrize("bound", [2**40 + 1, 3 * 2**60 + 12345, 2**62])
def test_uniform_below_large_bounds(bound: int) -> None:
    x = secure.uniform_below(stream("below", bound), 100_000, bound)
    assert x.min() >= 0 and x.max() < bound
    # KS against the continuous uniform (the grid 1/bound is far below the test's resolution)
    assert scipy.stats.kstest(x / bound, "uniform").pvalue > P_MIN
    # the low bits are fair too
    assert scipy.stats.chisquare(np.bincount(x % 16, minlength=16)).pvalue > P_MIN


def test_uniform_below_edge_cases() -> None:
    assert np.array_equal(secure.uniform_below(Scripted([]), 5, 1), np.zeros(5, np.int64))  # reads nothing
    assert secure.uniform_below(stream(), 0, 10).shape == (0,)
    for bad in (0, 2**62 + 1):
        with pytest.raises(ValueError):
            secure.uniform_below(stream(), 3, bad)
    with pytest.raises(TypeError):
        secure.uniform_below(stream(), 3, 2.0)  # type: ignore[arg-type]


def test_uniform01() -> None:
    u = secure.uniform01(stream("u01"), 100_000)
    assert u.dtype == np.float64 and u.min() > 0 and u.max() < 1
    assert scipy.stats.kstest(u, "uniform").pvalue > P_MIN
    # k = top 53 bits; k = 0 maps to 2**-54
    got = secure.uniform01(Scripted([0, 2**11 - 1, 2**11, 2**64 - 1]), 4)
    assert got.tolist() == [2.0**-54, 2.0**-54, 2.0**-53, 1 - 2.0**-53]


@pytest.mark.parametrize(("rate", "n"),
                         [(0.2, 100_000), (0.01, 100_000), (1e-5, 2_000_000), (1 / 3, 100_000)])
def test_bernoulli_rates(rate: float, n: int) -> None:
    x = secure.bernoulli(stream("bern", str(rate)), n, rate)
    assert x.dtype == bool and x.shape == (n,)
    assert scipy.stats.binomtest(int(x.sum()), n, rate).pvalue > P_MIN


def test_bernoulli_zero_one_and_the_128_bit_path() -> None:
    assert not secure.bernoulli(Scripted([]), 10, 0.0).any()
    assert secure.bernoulli(Scripted([]), 10, 1.0).all()
    # 0.2 * 2**64 is an integer: one word each, compared with it
    m = int(Fraction(0.2) * 2**64)
    assert secure.bernoulli(Scripted([m - 1, m]), 2, 0.2).tolist() == [True, False]
    # 1e-5 is not a multiple of 2**-64: the high word decides, a tie reads a low word
    big = math.floor(Fraction(1e-5) * 2**128)
    assert Fraction(big, 2**128) == Fraction(1e-5)  # exact for rates >= 2**-76
    hi, lo = big >> 64, big & (2**64 - 1)
    words = [hi - 1, hi + 1, hi, hi, lo - 1, lo]  # four draws; the two ties read their low words last
    assert secure.bernoulli(Scripted(words), 4, 1e-5).tolist() == [True, False, True, False]
    # a rate of 2**-70: the high word must be 0 and the low word below 2**58
    tiny = 2.0**-70
    assert secure.bernoulli(Scripted([0, 1, 2**58 - 1]), 2, tiny).tolist() == [True, False]
    assert secure.bernoulli(Scripted([0, 2**58 - 1]), 1, tiny).tolist() == [True]
    assert secure.bernoulli(Scripted([0, 2**58]), 1, tiny).tolist() == [False]
    assert secure.bernoulli(Scripted([1]), 1, tiny).tolist() == [False]
    # below 2**-76 the rate is floored to a multiple of 2**-128
    assert secure.bernoulli(Scripted([0, 0]), 1, 5e-324).tolist() == [False]
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError):
            secure.bernoulli(stream(), 3, bad)


# --------------------------------------------------------------------------- discrete Laplace


def laplace_cdf(k: np.ndarray, t: float) -> np.ndarray:
    """P(Z <= k) for the discrete Laplace exp(-|k|/t): q^-k/(1+q) for k < 0, 1 - q^(k+1)/(1+q) for k >= 0."""
    q = math.exp(-1.0 / t)
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(over="ignore"):
        return np.where(k < 0, np.exp(k / t) / (1 + q), 1 - np.exp(-(k + 1) / t) / (1 + q))


def laplace_pvalue(z: np.ndarray, scale: int) -> float:
    """Chi-square p-value of z against the discrete Laplace of the given scale."""
    if scale <= 5:
        ks = np.arange(-15 * scale - 5, 15 * scale + 6)
        return chi2_pmf(z, ks, np.exp(-np.abs(ks) / scale))
    # bins between quantiles of the exact cdf
    cuts = np.unique(np.round(scipy.stats.laplace.ppf(np.linspace(0, 1, 41)[1:-1], scale=scale)))
    edges = np.concatenate([[-np.inf], cuts, [np.inf]])
    cdf = np.concatenate([[0.0], laplace_cdf(cuts - 1, scale), [1.0]])
    return chi2_binned(z.astype(np.float64), edges, np.diff(cdf))


@pytest.mark.parametrize("scale", [1, 3, 5, 1000, 2**20 + 1, 2**40])
def test_discrete_laplace_matches_its_pmf(scale: int) -> None:
    n = 100_000
    z = secure.discrete_laplace(stream("lap", scale), n, scale)
    assert z.dtype == np.int64 and z.shape == (n,)
    assert laplace_pvalue(z, scale) > P_MIN
    if scale <= 3:
        assert np.count_nonzero(z == 0) > 0
    # the variance of the discrete Laplace: 2q / (1 - q)^2
    q = math.exp(-1 / scale)
    assert np.var(z.astype(np.float64)) == pytest.approx(2 * q / (1 - q) ** 2, rel=0.05)
    # the low bits of a large scale are uniform too
    if scale > 2**20:
        assert scipy.stats.chisquare(np.bincount(z % 64, minlength=64)).pvalue > P_MIN


@pytest.fixture
def exact_below(monkeypatch: pytest.MonkeyPatch) -> list[Fraction]:
    """Records the gamma of every exact comparison W < exp(-gamma) (all exact paths go through it)."""
    calls: list[Fraction] = []
    exact = secure._exact_below_exp

    def recording(s: secure.Stream, a: int, bits: int, gamma: Fraction) -> tuple[bool, int, int]:
        calls.append(gamma)
        return exact(s, a, bits, gamma)

    monkeypatch.setattr(secure, "_exact_below_exp", recording)
    return calls


def test_the_exact_laplace_paths_are_rare_by_default(exact_below: list[Fraction]) -> None:
    assert secure._LAPLACE_MARGIN == 2.0**-40 and secure._GEOMETRIC_SLACK == 0
    secure.discrete_laplace(stream("lap-rare"), 200_000, 3)
    secure.discrete_laplace(stream("lap-rare"), 200_000, 2**38 + 12345)
    assert len(exact_below) <= 2


def test_exp_floor_table_is_exact() -> None:
    with mpmath.workdps(60):
        expected = [int(mpmath.floor(mpmath.exp(-k) * 2**64)) for k in range(1, 46)]
    assert list(secure._EXP_FLOORS) == expected
    assert expected[-2:] == [1, 0] and len(expected) == 45


def test_geometric_matches_its_pmf() -> None:
    # P(V = k) = e^{-k} (1 - e^{-1}); one word per element, no exact path
    v = secure._geometric(stream("geo"), 200_000)
    assert v.dtype == np.int64 and v.min() >= 0
    ks = np.arange(0, 40)
    assert chi2_pmf(v, ks, np.exp(-ks.astype(np.float64))) > P_MIN
    assert secure._geometric(Scripted([]), 0).shape == (0,)


@pytest.mark.parametrize("slack", [2**60, 2**64 - 1])
def test_geometric_with_wide_bands(monkeypatch: pytest.MonkeyPatch, exact_below: list[Fraction],
                                   slack: int) -> None:
    """Bands of +-slack around the thresholds send a large share (at 2**64 - 1, all) to exact arithmetic."""
    monkeypatch.setattr(secure, "_GEOMETRIC_SLACK", slack)
    n = 20_000
    v = secure._geometric(stream("geo-wide", slack), n)
    assert len(exact_below) > (1.0 if slack == 2**64 - 1 else 0.25) * n
    assert set(exact_below) <= {Fraction(k) for k in range(1, 60)}
    ks = np.arange(0, 20)
    assert chi2_pmf(v, ks, np.exp(-ks.astype(np.float64))) > P_MIN
    with pytest.raises(ValueError, match="_GEOMETRIC_SLACK"):
        monkeypatch.setattr(secure, "_GEOMETRIC_SLACK", -1)
        secure._geometric(stream(), 3)


def test_geometric_ties_read_more_bits() -> None:
    c1, top = secure._EXP_FLOORS[0], 2**64 - 1
    words = [c1 - 1, c1 + 1, c1, c1, 0, 1,  # the six words, then the continuations of the undecided ones:
             0, 0,  # c1 then zeros: W = c1 2**-64 < e^-1, and > e^-2: V = 1
             top, top,  # c1 then ones: W > (c1 + 1 - 2**-128) 2**-64 > e^-1: V = 0
             2**63, 0,  # 0 then 2**63: W in [2**-65, 2**-65 + 2**-192), and e^-46 < 2**-65 < e^-45: V = 45
             0, 0]  # 1 = c_44 then zeros: W = 2**-64, and e^-45 < 2**-64 < e^-44: V = 44
    assert secure._geometric(Scripted(words), 6).tolist() == [1, 0, 1, 0, 45, 44]


@pytest.mark.parametrize("margin", [2.0**-44, 2.0**-40])
def test_fast_laplace_bernoulli_agrees_with_exact_arithmetic(monkeypatch: pytest.MonkeyPatch,
                                                             margin: float) -> None:
    """The float64 interval of Bernoulli(exp(-u/t)) never decides against exp(-u/t), even just outside it."""
    monkeypatch.setattr(secure, "_LAPLACE_MARGIN", margin)
    ctx = decimal.Context(prec=70)
    for t in (1, 2, 3, 1000, 12345, 2**38 + 7, 2**60):
        us, words, expected = [], [], []
        for u in sorted({0, 1, t // 3, t // 2, t - 1}):
            p = Fraction(ctx.exp(ctx.divide(-decimal.Decimal(u), decimal.Decimal(t))))
            top = math.floor(p * 2**64)  # W < p for V <= top, the next (zero) words deciding V = top
            step = max(1, int(p * 2**64 * margin))
            for offset in (-4 * step, -step // 2, -2048, -1, 0, 1, 2048, step // 2, 4 * step, 2**40):
                v = top + offset
                if 0 <= v < 2**64:
                    us.append(u)
                    words.append(v)
                    expected.append(v <= top)
        valid = np.ones(len(us), bool)
        valid[-1] = False  # an invalid element (U >= t in the sampler) is False, whatever its word
        got = secure._bern_exp_ratio(Scripted([0] * (2 * len(words))), np.array(us, np.uint64),
                                     np.array(words, np.uint64), t, valid)
        assert got.tolist() == expected[:-1] + [False], t


def test_interval_test_edges() -> None:
    w = np.array([0, 2**11, 2**64 - 1], np.uint64)  # top 53 bits k = 0, 1, 2**53 - 1
    zero = np.zeros(3)
    sure, undecided = secure._interval_test(w, zero, zero, 2.0**-40)  # p_hi underflowed: p < 2**-54
    assert not sure.any() and undecided.tolist() == [True, False, False]
    one = np.ones(3)
    sure, undecided = secure._interval_test(w, one, one, 2.0**-40)
    assert sure.tolist() == [True, True, False] and undecided.tolist() == [False, False, True]
    sure, undecided = secure._interval_test(w, one, one, 4.0)  # a margin above 1 decides no W < p
    assert not sure.any() and undecided.all()


@pytest.mark.parametrize(("scale", "margin", "slack"),
                         [(3, 0.5, 0), (1000, 0.5, 2**60), (2**38 + 12345, 0.5, 2**60), (5, 4.0, 2**64 - 1)])
def test_discrete_laplace_with_exact_decisions(monkeypatch: pytest.MonkeyPatch, exact_below: list[Fraction],
                                               scale: int, margin: float, slack: int) -> None:
    """Wide float intervals and integer bands send a large share of decisions to the exact path (with
    margin 4 and the widest bands: every one); the law must not move."""
    monkeypatch.setattr(secure, "_LAPLACE_MARGIN", margin)
    monkeypatch.setattr(secure, "_GEOMETRIC_SLACK", slack)
    n = 10_000 if margin > 1 else 15_000
    z = secure.discrete_laplace(stream("lap-exact", scale, str(margin), slack), n, scale)
    integer = [g for g in exact_below if g.denominator == 1 and g >= 1]  # the geometric's e^-k
    ratio = [g for g in exact_below if g < 1]  # the Bernoulli(exp(-U/t))'s
    assert len(ratio) > (1.0 if margin > 1 else 0.4) * n
    assert len(integer) > {0: -1, 2**60: 0.25 * n, 2**64 - 1: n}[slack]
    assert laplace_pvalue(z, scale) > P_MIN
    # deterministic, exact path included: the same stream gives the same values from the same words
    first, again = stream("lap-exact-det", scale), stream("lap-exact-det", scale)
    z = secure.discrete_laplace(first, 1000, scale)
    assert np.array_equal(secure.discrete_laplace(again, 1000, scale), z) and again._read == first._read


def test_the_laplace_margin_cannot_go_below_the_error_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secure, "_LAPLACE_MARGIN", 2.0**-45)
    with pytest.raises(ValueError, match="_LAPLACE_MARGIN"):
        secure.discrete_laplace(stream(), 10, 3)


def test_discrete_laplace_refuses_what_int64_cannot_hold() -> None:
    # at scale 2**60 a variate needs V >= 8 (probability ~e^-8) to pass 2**63: refused, not wrapped
    with pytest.raises(OverflowError, match="int64"):
        secure.discrete_laplace(stream("lap-overflow"), 20_000, 2**60)
    for bad in (0, 2**60 + 1):
        with pytest.raises(ValueError):
            secure.discrete_laplace(stream(), 3, bad)
    with pytest.raises(TypeError):
        secure.discrete_laplace(stream(), 3, 2.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- discrete Gaussian


@pytest.mark.parametrize("sigma", [1.0, 1.5, 10.0, 1000.0])
def test_discrete_gaussian_matches_its_pmf(sigma: float) -> None:
    n = 100_000
    z = secure.discrete_gaussian(stream("gauss", str(sigma)), n, sigma)
    assert z.dtype == np.int64 and z.shape == (n,)
    ks = np.arange(-math.ceil(12 * sigma) - 5, math.ceil(12 * sigma) + 6)
    pmf = np.exp(-(ks.astype(np.float64) ** 2) / (2 * sigma**2))
    assert chi2_pmf(z, ks, pmf) > P_MIN
    var = float((ks**2 * pmf).sum() / pmf.sum())
    assert np.var(z.astype(np.float64)) == pytest.approx(var, rel=0.03)


@pytest.mark.parametrize("sigma", [2.0**30, 2.0**40 + 2.0**17, 2.0**50])
def test_discrete_gaussian_at_release_scales(sigma: float) -> None:
    # within total variation 1e-18 of the rounded normal: bins between its quantiles
    n = 100_000
    z = secure.discrete_gaussian(stream("gauss-big", str(sigma)), n, sigma)
    cuts = np.unique(np.round(scipy.stats.norm.ppf(np.linspace(0, 1, 41)[1:-1], scale=sigma)))
    edges = np.concatenate([[-np.inf], cuts, [np.inf]])
    cdf = np.concatenate([[0.0], scipy.stats.norm.cdf(cuts - 0.5, scale=sigma), [1.0]])
    assert chi2_binned(z.astype(np.float64), edges, np.diff(cdf)) > P_MIN
    assert np.std(z.astype(np.float64)) == pytest.approx(sigma, rel=0.01)
    assert abs(np.mean(z.astype(np.float64))) < 5 * sigma / math.sqrt(n)
    # the low bits are uniform too (nothing of the float arithmetic shows in them)
    assert scipy.stats.chisquare(np.bincount(z % 64, minlength=64)).pvalue > P_MIN


def test_discrete_gaussian_is_deterministic() -> None:
    a = secure.discrete_gaussian(stream("det"), 5000, 2.0**35)
    assert np.array_equal(a, secure.discrete_gaussian(stream("det"), 5000, 2.0**35))
    assert not np.array_equal(a, secure.discrete_gaussian(stream("det2"), 5000, 2.0**35))
    for bad in (0.5, math.inf, 2.0**57 + 2.0**5):
        with pytest.raises(ValueError):
            secure.discrete_gaussian(stream(), 3, bad)


@pytest.fixture
def exact_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the acceptance decisions taken by the exact (decimal/Fraction) path."""
    calls: list[int] = []
    exact = secure._exact_accept

    def counting(*args: object) -> bool:
        calls.append(1)
        return exact(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(secure, "_exact_accept", counting)
    return calls


def test_the_exact_path_is_rare_by_default(exact_calls: list[int]) -> None:
    assert secure._ACCEPT_MARGIN == 2.0**-40
    secure.discrete_gaussian(stream("rare"), 100_000, 10.0)
    assert len(exact_calls) <= 2


def test_discrete_gaussian_with_a_wide_margin(exact_calls: list[int],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide float interval sends a large share of decisions to the exact path; the law must not move."""
    monkeypatch.setattr(secure, "_ACCEPT_MARGIN", 0.5)
    sigma, n = 10.0, 30_000
    z = secure.discrete_gaussian(stream("wide"), n, sigma)
    assert len(exact_calls) > 0.3 * n
    ks = np.arange(-130, 131)
    assert chi2_pmf(z, ks, np.exp(-(ks.astype(np.float64) ** 2) / (2 * sigma**2))) > P_MIN


def test_discrete_gaussian_all_exact(exact_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """With a margin above 1 the float test decides nothing: every acceptance is exact."""
    monkeypatch.setattr(secure, "_ACCEPT_MARGIN", 4.0)
    sigma, n = 1.5, 15_000
    z = secure.discrete_gaussian(stream("all-exact"), n, sigma)
    assert len(exact_calls) >= n
    ks = np.arange(-25, 26)
    assert chi2_pmf(z, ks, np.exp(-(ks.astype(np.float64) ** 2) / (2 * sigma**2))) > P_MIN


def test_the_margin_cannot_go_below_the_error_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secure, "_ACCEPT_MARGIN", 0.0)
    with pytest.raises(ValueError, match="_ACCEPT_MARGIN"):
        secure.discrete_gaussian(stream(), 10, 3.0)


@pytest.mark.parametrize("margin", [2.0**-44, 2.0**-40])
def test_fast_acceptance_agrees_with_exact_arithmetic(monkeypatch: pytest.MonkeyPatch, margin: float) -> None:
    """The float64 interval never decides against exp(-gamma), even just outside its margin."""
    monkeypatch.setattr(secure, "_ACCEPT_MARGIN", margin)
    ctx = decimal.Context(prec=70)
    for sigma in (1.0, 1.5, 10.0, 12345.678, 2.0**40 + 3.0, 2.0**50):
        t = math.floor(sigma) + 1
        s2 = Fraction(sigma) ** 2
        ys, words, expected = [], [], []
        centre = round(s2 / t)  # gamma about 0 there: exp(-gamma) about 1
        for y in sorted({0, 1, t, centre, centre + 1, int(0.7 * sigma), int(3 * sigma), int(20 * sigma)}):
            gamma = (y - s2 / t) ** 2 / (2 * s2)
            g = ctx.divide(decimal.Decimal(gamma.numerator), decimal.Decimal(gamma.denominator))
            p = Fraction(ctx.exp(ctx.minus(g)))
            top = math.floor(p * 2**64)  # W < p for V < top; V = top is decided by the next (zero) words
            step = max(1, int(p * 2**64 * margin))
            for offset in (-4 * step, -step // 2, -1, 0, 1, step // 2, 4 * step, 2**40):
                v = top + offset
                if 0 <= v < 2**64:
                    ys.append(y)
                    words.append(v)
                    expected.append(v <= top)
        got = secure._accept_gaussian(Scripted(words + [0] * (2 * len(words))), np.array(ys), sigma, t)
        assert got.tolist() == expected, sigma


def test_exact_accept_reads_more_bits_until_decided() -> None:
    # gamma = (0 - 1/1)^2 / 2 = 1/2: the uniform W starts with V = floor(e^-1/2 2**64), so 64 bits cannot
    # decide; the next 128 bits do (W below e^-1/2 iff they are small).
    ctx = decimal.Context(prec=80)
    v = math.floor(Fraction(ctx.exp(decimal.Decimal(-0.5))) * 2**64)
    sigma = Fraction(1)
    assert secure._exact_accept(Scripted([0, 0]), 0, v, sigma, 1) is True
    assert secure._exact_accept(Scripted([2**64 - 1, 2**64 - 1]), 0, v, sigma, 1) is False
    assert secure._exact_accept(Scripted([]), 0, v - 1, sigma, 1) is True  # decided at 64 bits
    assert secure._exact_accept(Scripted([]), 0, v + 1, sigma, 1) is False
    # gamma = 0 (|y| = sigma^2 / t): always accepted
    assert secure._exact_accept(Scripted([]), 4, 2**64 - 1, Fraction(2), 1) is True
    # a huge gamma (here 5e11) is rejected without decimal as soon as W has a 1 bit
    assert secure._exact_accept(Scripted([]), 10**6, 1, sigma, 1) is False
    assert secure._exact_accept(Scripted([0, 0, 1, 0]), 10**6, 0, sigma, 1) is False
    lo, hi = secure._exp_neg_bounds(Fraction(1, 2), 30)
    assert lo < Fraction(ctx.exp(decimal.Decimal(-0.5))) < hi and hi - lo < Fraction(1, 10**27)


# --------------------------------------------------------------------------- grid and releases


@pytest.mark.parametrize("spread", [1.0, 0.37, 1e-3, 123456.789, 2.0**-20])
@pytest.mark.parametrize("d", [1, 3, 7850, 10**6])
def test_grid_is_the_largest_power_of_two_allowed(spread: float, d: int) -> None:
    g = secure.grid("laplace", spread, d)
    assert math.frexp(g)[0] == 0.5  # a power of two
    s = Fraction(spread) / 2**secure.GRID_BITS
    assert d * Fraction(g) <= s < 2 * d * Fraction(g)
    g = secure.grid("gaussian", spread, d)
    assert math.frexp(g)[0] == 0.5
    assert d * Fraction(g) ** 2 <= s**2 < 4 * d * Fraction(g) ** 2  # sqrt(d) g <= s < 2 sqrt(d) g


def test_grid_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="kind"):
        secure.grid("uniform", 1.0, 3)
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError):
            secure.grid("gaussian", bad, 3)
    with pytest.raises(ValueError):
        secure.grid("laplace", 1.0, 0)
    with pytest.raises(ValueError, match="float64"):
        secure.grid("laplace", 1e-300, 10)


@pytest.mark.parametrize("release", [secure.laplace_release, secure.gaussian_release])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_release_lies_on_the_grid(release, dtype: torch.dtype) -> None:
    value = torch.randn(7, 11, generator=torch.Generator().manual_seed(0), dtype=dtype) * 3
    out = release(value, 0.25, stream("grid", str(dtype)))
    assert out.shape == value.shape and out.dtype == dtype and out.device == value.device
    kind = "laplace" if release is secure.laplace_release else "gaussian"
    g = secure.grid(kind, 0.25, value.numel())
    ratio = out.double() / g
    assert torch.equal(ratio, ratio.round())
    assert not torch.equal(out, value)


@pytest.mark.parametrize("release", [secure.laplace_release, secure.gaussian_release])
def test_release_ignores_bits_below_the_grid(release) -> None:
    """The defence: values that round to the same grid points give the same output under the same stream."""
    kind = "laplace" if release is secure.laplace_release else "gaussian"
    d, spread = 4096, 0.5
    g = secure.grid(kind, spread, d)
    gen = torch.Generator().manual_seed(1)
    # values of magnitude ~1, whose ulp (<= 2**-51) is far below g: the wiggle stays below 0.4 g
    centres = torch.round(torch.randn(d, generator=gen, dtype=torch.float64) / g) * g
    wiggle = (torch.rand(d, generator=gen, dtype=torch.float64) - 0.5) * 0.8 * g
    assert not torch.equal(centres, centres + wiggle)
    a = release(centres, spread, stream("same"))
    b = release(centres + wiggle, spread, stream("same"))
    assert torch.equal(a, b)
    # and the noise is there: a different stream gives a different output
    assert not torch.equal(a, release(centres, spread, stream("other")))


def test_release_noise_has_the_right_moments() -> None:
    n = 100_000
    value = torch.full((n,), 3.25, dtype=torch.float64)
    noise = (secure.gaussian_release(value, 2.0, stream("moments-g")) - value).numpy()
    assert abs(noise.mean()) < 5 * 2.0 / math.sqrt(n)
    assert noise.std() == pytest.approx(2.0, rel=0.01)
    assert scipy.stats.kstest(noise / 2.0, "norm").pvalue > P_MIN
    noise = (secure.laplace_release(value, 1.5, stream("moments-l")) - value).numpy()
    assert abs(noise.mean()) < 5 * 1.5 * math.sqrt(2) / math.sqrt(n)
    assert noise.std() == pytest.approx(1.5 * math.sqrt(2), rel=0.02)
    assert scipy.stats.kstest(noise, "laplace", args=(0, 1.5)).pvalue > P_MIN


def test_release_refuses_what_it_cannot_do_exactly() -> None:
    # the refusals name no number computed from the value: a deployed node's error text reaches the server,
    # and reads the same for neighbouring values
    with pytest.raises(ValueError, match="^value has a NaN entry; a release needs numbers$"):
        secure.gaussian_release(torch.tensor([1.0, math.nan]), 1.0, stream())
    for release in (secure.laplace_release, secure.gaussian_release):
        with pytest.raises(ValueError, match="without noise"):
            release(torch.ones(3), 0.0, stream())
        with pytest.raises(ValueError):
            release(torch.ones(3), -1.0, stream())
        with pytest.raises(TypeError):
            release(torch.ones(3, dtype=torch.int64), 1.0, stream())
    with pytest.raises(ValueError, match="fewer coordinates"):
        secure.laplace_release(torch.zeros(2**25), 1.0, stream())
    # a large value is released as it is
    ok = secure.gaussian_release(torch.tensor([1e6]), 1.0, stream())
    assert abs(float(ok) - 1e6) < 10


@pytest.mark.parametrize("release", [secure.laplace_release, secure.gaussian_release])
def test_a_release_never_refuses_a_value_for_its_size(release) -> None:
    """Whether a release happens never depends on the value's size: a server that pushed a value's public part
    to the edge of int64's range would otherwise learn from the refusal which side of it one sample put the
    value (one noise-free bit). Each coordinate is clamped into the range instead (+-inf too): two values
    past the edge give the same integer before the noise, and clamping never moves neighbours apart."""
    g = secure.grid("laplace" if release is secure.laplace_release else "gaussian", 1.0, 2)
    edge = (2**62 - 60 * (1.0 / g)) * g  # the largest magnitude int64 arithmetic holds (1 noise scale = 1/g)
    for beyond in (1e30, 2e30, math.inf, -math.inf, 1e308):
        out = release(torch.tensor([0.5, beyond]), 1.0, stream("edge"))
        same = release(torch.tensor([0.5, math.copysign(edge, beyond)]), 1.0, stream("edge"))
        assert torch.equal(out, same)
        assert torch.isfinite(out).all()
    # 1-Lipschitz: two values on either side of the edge come out no further apart than they went in
    low, high = release(torch.tensor([edge * (1 - 1e-9)]), 1.0, stream("l")), release(
        torch.tensor([edge * (1 + 1e-9)]), 1.0, stream("l"))
    assert 0 <= float(high - low) <= edge * 2e-9 + 2 * g


def test_release_of_any_shape() -> None:
    for shape in [(), (1,), (2, 3, 4), (0, 5)]:
        value = torch.ones(shape, dtype=torch.float32)
        out = secure.gaussian_release(value, 1.0, stream("shape"))
        assert out.shape == value.shape and out.dtype == torch.float32


# --------------------------------------------------------------------------- privacy cost of the grid


def test_importing_the_module_does_not_import_torch() -> None:
    """The ledger imports this module, and ``dpadmm privacy`` must run without torch."""
    code = "import sys, dpadmm.privacy.secure, dpadmm.privacy.ledger; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_constants() -> None:
    assert secure.GRID_RATIO == 2.0**-33 and secure.GRID_TAIL == 2.0**-64
    assert secure.MIN_GAUSSIAN_MULTIPLIER == 2.0**-10
    assert secure.laplace_epsilon_cost() == 2.0**-32
    for name in ("gaussian_tv", "gaussian_delta_cost", "gaussian_multiplier"):
        assert not hasattr(secure, name)


@pytest.mark.parametrize("t", [1, 2, 10, 100])
def test_laplace_log_ratio_bounds_the_true_ratio(t: int) -> None:
    """r = P(round(N) = j), N continuous Laplace(t), against p = the discrete Laplace, by definition."""
    with mpmath.workdps(40):
        def cdf(u: mpmath.mpf) -> mpmath.mpf:  # the continuous Laplace of scale t
            return mpmath.exp(u / t) / 2 if u < 0 else 1 - mpmath.exp(-u / t) / 2

        normaliser = mpmath.coth(mpmath.mpf(1) / (2 * t))  # sum_k e^{-|k|/t}
        x = mpmath.mpf(1) / (2 * t)
        logs = []
        for j in range(-10 * t - 3, 10 * t + 4):
            r = cdf(mpmath.mpf(j) + 0.5) - cdf(mpmath.mpf(j) - 0.5)
            p = mpmath.exp(-abs(mpmath.mpf(j)) / t) / normaliser
            expected = mpmath.cosh(x) if j else (1 + mpmath.exp(-2 * x)) / (1 + mpmath.exp(-x))
            assert mpmath.almosteq(r / p, expected, rel_eps=mpmath.mpf(10) ** -30)
            logs.append(abs(float(mpmath.log(r / p))))
    true = max(logs)
    bound = secure.laplace_log_ratio(t)
    assert true <= bound <= 1.6 * true  # tight: 1/(4t) against 1/(4t) - 3/(32 t^2) + ...
    assert bound == pytest.approx(1 / (4 * t), rel=1e-12)


@pytest.mark.parametrize("s", [1.0, 2.0, 5.0, 20.0])
def test_gaussian_log_ratio_bounds_the_true_ratio(s: float) -> None:
    """r = P(round(N) = j), N ~ N(0, s^2), against p = the discrete Gaussian, normalised numerically."""
    top = int(40 * s)
    with mpmath.workdps(50):
        sm = mpmath.mpf(s)
        width = sm * mpmath.sqrt(2)
        normaliser = mpmath.fsum(mpmath.exp(-mpmath.mpf(k) ** 2 / (2 * sm**2)) for k in range(-top, top + 1))
        logs = {}
        for j in range(0, top + 1):  # both laws are symmetric
            # P(j - 1/2 < N < j + 1/2) by upper tails (erfc), accurate far out; P(|N| < 1/2) at j = 0
            lo, hi = (j - mpmath.mpf(0.5)) / width, (j + mpmath.mpf(0.5)) / width
            r = (mpmath.erfc(lo) - mpmath.erfc(hi)) / 2 if j else mpmath.erf(hi)
            p = mpmath.exp(-mpmath.mpf(j) ** 2 / (2 * sm**2)) / normaliser
            logs[j] = float(mpmath.log(r / p))
    floor = secure.gaussian_log_ratio(s, 0.0)
    for j, value in logs.items():
        assert -floor <= value <= secure.gaussian_log_ratio(s, j / s), j  # pointwise, at every j
    for b in (1.0, 3.0, 6.0):
        true = max(abs(v) for j, v in logs.items() if j <= b * s)
        bound = secure.gaussian_log_ratio(s, b)
        assert true <= bound <= 10 * true
    # second order in 1/s: at |j| = 3 s the ratio is e^{(9 - 1)/(24 s^2)} to leading order
    j = int(3 * s)
    if s >= 2:
        assert logs[j] == pytest.approx(((j / s) ** 2 - 1) / (24 * s * s), rel=0.05, abs=1e-3 / s**2)


def test_gaussian_log_ratio_is_second_order() -> None:
    for s in (2.0**10, 2.0**32, 2.0**50):
        assert secure.gaussian_log_ratio(s, 0.0) == pytest.approx(1 / (24 * s * s), rel=1e-9)
        assert secure.gaussian_log_ratio(s, 100.0) == pytest.approx(100.0**2 / (24 * s * s), rel=1e-9)


@pytest.mark.parametrize("d", [1, 7850, 48608, 2**23])
def test_grid_ratio_and_tail_cover_every_release(d: int) -> None:
    """The per-release constants a ledger composes cover the grids that :func:`grid` picks."""
    for spread in (1.0, 0.37, 2.0**-20):
        t = math.ceil(Fraction(spread) / Fraction(secure.grid("laplace", spread, d)))
        s = spread / secure.grid("gaussian", spread, d)
        assert t >= d * 2**32 and s >= math.sqrt(d) * 2**32
        assert d * secure.laplace_log_ratio(t) <= secure.GRID_RATIO / 2 * (1 + 2.0**-40)  # 2**-34
        # the window of the full-batch argument: 40 s under D, shifted by s/z + 1 under D'
        assert 40 * s + s / secure.MIN_GAUSSIAN_MULTIPLIER + 1 <= (41 + 2**10) * s
        assert d * secure.gaussian_log_ratio(s, 41 + 1 / secure.MIN_GAUSSIAN_MULTIPLIER) <= secure.GRID_RATIO
    # the worst cases the grid allows
    assert d * secure.laplace_log_ratio(d * 2**32) <= secure.GRID_RATIO
    worst = math.sqrt(d) * 2.0**32
    assert d * secure.gaussian_log_ratio(worst, 40 + 1 / secure.MIN_GAUSSIAN_MULTIPLIER) <= secure.GRID_RATIO
    assert d * secure.gaussian_log_ratio(worst, 41 + 1 / secure.MIN_GAUSSIAN_MULTIPLIER) <= 2.0**-48
    assert d * secure.gaussian_log_ratio(worst, 2.0**17) <= secure.GRID_RATIO  # the subsampled route's window
    # tails, in logs: a discrete Gaussian coordinate beyond 40 s (sub-Gaussian: 2 e^-800), over d < 2**49
    assert math.log(2 * 2.0**49) - 800 <= math.log(secure.GRID_TAIL)
    # the subsampled route: e^{eps + T eta} d e^{1 - 2**33} <= GRID_TAIL for eps <= 2**32, T <= 2**64
    exponent = 2.0**32 + 2.0**64 * secure.GRID_RATIO + math.log(2.0**49) + 1 - 2.0**33
    assert exponent <= math.log(secure.GRID_TAIL)
    assert (2.0**17 - 0.5 / worst) ** 2 / 2 >= 2.0**33 - 1


def test_log_ratio_functions_refuse_bad_input() -> None:
    with pytest.raises(ValueError):
        secure.laplace_log_ratio(0)
    with pytest.raises(TypeError):
        secure.laplace_log_ratio(1.5)  # type: ignore[arg-type]
    for bad in ((0.5, 1.0), (2.0, -1.0), (math.inf, 1.0), (2.0, math.nan)):
        with pytest.raises(ValueError):
            secure.gaussian_log_ratio(*bad)
