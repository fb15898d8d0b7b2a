"""Deployment randomness: floating-point-safe noise from a cryptographic stream under a node's own key.

Two kinds of randomness. :mod:`dpadmm.privacy.noise` is the *simulation kind*: Philox keyed by a public
32-bit seed, so that every execution path (a Flower client, the batched engine, a GPU) draws the same
numbers and a run can be replayed. That is what experiments need, and it is no protection at all in a
deployment: whoever knows the seed knows the noise and can subtract it. This module is the *deployment
kind*: the noise of a node comes from a ChaCha20 keystream under a 32-byte secret that only the node holds
(:func:`new_key`), one stream per draw coordinate (:func:`derive`, :func:`draw_stream`), and it is added
on a grid, in integers, so that the released floating-point numbers say nothing beyond what the
mechanism's privacy analysis allows.

Why a grid. The textbook mechanisms add a real-valued Laplace or Gaussian variate, and a computer adds a
floating-point one. Mironov ("On significance of the least significant bits for differential privacy",
CCS 2012) showed that the low-order bits of ``value + noise`` computed in floating point, with the noise
made by the usual transforms of a uniform double (``-b log U``), depend on ``value``: many outputs can
only arise from one of two neighbouring inputs, so the released number can reveal the input outright.
Jin, McMurtry, Rubinstein and Ohrimenko ("Are we there yet? Timing and floating-point attacks on
differential privacy systems", IEEE S&P 2022) extended the floating-point attack to the Gaussian samplers
of the major libraries (Box-Muller, polar, ziggurat) and showed timing attacks on samplers whose running
time depends on the noise. The defence, used by Google's differential-privacy library (its "secure
noise": noise on a power-of-two granularity) and by OpenDP (exact samplers on integers from a CSPRNG), is
to round the value to a grid of step ``g`` (a power of two, so the rounding is exact), add *integer* noise
drawn exactly from cryptographic random bits, and only then turn the integer back into a float:

    output = g * (round(value / g) + Z),   Z ~ discrete Laplace or discrete Gaussian (in units of g).

The output is a function of the integer ``round(value / g) + Z`` only, so its low bits are a
post-processing of a mechanism whose analysis is exact, and ``value``'s bits below the grid never reach
it. The integer samplers are those of Canonne, Kamath and Steinke ("The Discrete Gaussian for
Differential Privacy", NeurIPS 2020; CKS below): Algorithm 2 (discrete Laplace) and Algorithm 3 (discrete
Gaussian by rejection from a discrete Laplace), exact in distribution. Their Bernoulli(exp(-gamma)) events
(CKS build them from loops of Bernoulli trials of rational rates, their Algorithm 1) are decided here by
comparing a uniform real W, whose binary expansion the stream gives 64 bits at a time, with exp(-gamma):
P(W < exp(-gamma)) = exp(-gamma). One vectorised pass decides all but a tiny share of the comparisons
(about 2**-39 by default) from W's first word: against float64 bounds that provably contain exp(-gamma)
(the Laplace's Bernoulli(exp(-U/t)) and the Gaussian's acceptance), or against the exact integers
floor(e^{-k} 2**64) (the Laplace's geometric count). The rest read more bits of W and compare them with
exp(-gamma) computed by :mod:`decimal` to a precision that grows until it decides, in exact rational
arithmetic. The values themselves are integer arithmetic on numpy int64 / uint64 arrays: floating point
only sorts comparisons into decided and undecided ones (:func:`discrete_laplace`, :func:`discrete_gaussian`).

The grid. For a release of ``d`` coordinates, :func:`grid` picks the largest power of two ``g`` with
``d * g <= 2**-GRID_BITS * scale`` (Laplace, whose sensitivity is an L1 norm) or
``sqrt(d) * g <= 2**-GRID_BITS * std`` (Gaussian, L2), so the grid is fine compared with the noise and
its privacy cost is a fixed, tiny, composable amount:

PRIVACY COST OF THE GRID (what a ledger must compose; GRID_BITS = 32, GRID_RATIO = 2**-33,
GRID_TAIL = 2**-64, MIN_GAUSSIAN_MULTIPLIER = 2**-10):

* The rounding. In grid units a release is M'(D) = k + Z, k = round(value / g) an integer vector, Z the
  discrete noise. Rounding moves a coordinate by at most 1/2, so neighbours' k differ by at most
  Delta / g + d in L1 (Laplace) or Delta / g + sqrt(d) in L2 (Gaussian; and by Delta / g + 1 in each
  coordinate), and the grid makes d g <= 2**-32 scale, sqrt(d) g <= 2**-32 std. Let M(D) = k + round(N),
  N a continuous Laplace of scale t = ceil(scale / g) >= scale / g, or N(0, s^2) with s = std / g, per
  coordinate. As k + round(N) = round(k + N), M is a post-processing of the continuous mechanism on k,
  whose noise multiplier (noise scale over sensitivity) is >= z' = 1 / (1/z + 2**-32) for the multiplier
  z = scale / Delta or std / Delta on ``value`` (the ledger's ``Release.deployed_multiplier``). What an
  accountant proves for M at z' (with adaptive composition and Poisson subsampling) carries over to M'
  as follows. A single full-batch Laplace release is moreover pure (Delta / scale + 2**-32)-DP directly
  (:func:`laplace_epsilon_cost`): a discrete Laplace of scale t on integer vectors at L1 distance
  <= Delta / g + d is pure ((Delta / g + d) / t)-DP.
* Pointwise ratios, per coordinate, with r(j) = P(round(N) = j) and p(j) = P(Z = j).
  Laplace, x = 1/(2t): an exponential integrates to an exponential, r(j) = e^{-|j|/t} sinh(x) for j != 0,
  r(0) = 1 - e^{-x}, and p(j) = e^{-|j|/t} tanh(x). So r/p = cosh(x) for j != 0, and
  r(0)/p(0) = (1 + e^{-2x}) / (1 + e^{-x}) lies in [e^{-x/2}, 1] (with u = e^{-x/2} the lower bound reads
  (1 - u)(1 - u^3) >= 0). As ln cosh x <= x^2/2 <= x/2 for t >= 1: |ln(r(j)/p(j))| <= 1/(4t) for EVERY
  integer j (:func:`laplace_log_ratio`; tight: at j = 0 it is 1/(4t) - 3/(32 t^2) + O(t^-4)).
  Gaussian: r(j) = phi(j) I(j), phi the N(0, s^2) density, I(j) = integral over |u| <= 1/2 of
  exp(-(2ju + u^2)/(2s^2)) du = integral of cosh(a u) e^{-u^2/(2s^2)} du, a = j/s^2; and p(j) = phi(j)/S,
  S = sum_k e^{-k^2/(2s^2)} / (s sqrt(2 pi)) in [1, 1 + 2q/(1 - q)], q = exp(-2 pi^2 s^2) (Poisson
  summation). cosh >= 1 and e^{-v} >= 1 - v give I >= 1 - 1/(24 s^2); e^{-u^2/(2s^2)} <= 1 and
  sinh(y)/y <= e^{y^2/6} (its product formula) give I <= sinh(a/2)/(a/2) <= e^{a^2/24}. Hence for all j::

      -1/(24 s^2 - 1) <= ln(r(j)/p(j)) <= j^2/(24 s^4) + 2q/(1 - q),

  and for |j| <= B s, |ln(r/p)| <= max(1/(24 s^2 - 1), B^2/(24 s^2) + 2q/(1 - q))
  (:func:`gaussian_log_ratio`): second order in 1/s. The lower bound holds for every j; the upper one
  needs a window (the rounded Gaussian's tail is heavier than the discrete one's by e^{j^2/(24 s^4)}).
* One release of d coordinates (ratios multiply): with t >= d 2**32, |ln(M'(y)/M(y))| <= d/(4t) <= 2**-34
  for every output y; with s >= sqrt(d) 2**32 and every noise coordinate within B s, it is
  <= B^2 2**-64 / 24 + d 2q/(1 - q) <= GRID_RATIO = eta for any B <= 2**17. Below, d < 2**49 (the int64
  check keeps s below 2**62 / 60), and T releases compose adaptively.
* Composition. Let D, D' be neighbours, S a set of transcripts, and M (epsilon, delta)-DP. Let G be the
  event that every Gaussian noise coordinate of M'(D) lies within 40 s: the noise is y - k(D), k(D) a
  function of D and the past transcript, so G is a set of transcripts, and P[M'(D) not in G]
  <= T d 2 e^{-800} <= T GRID_TAIL (the discrete Gaussian is sub-Gaussian, CKS). On G the noise under D' is
  y - k(D'), within 40 s + s/z + 1 <= (41 + 2**10) s per coordinate when z >= MIN_GAUSSIAN_MULTIPLIER
  (s >= 2**32). So on G the transcript probabilities of M' and M are within a factor e^{T eta} of each
  other, under D and under D' (the Laplace needs no G). Hence::

      P[M'(D) in S] <= P[M'(D) in S and G] + T GRID_TAIL <= e^{T eta} P[M(D) in S and G] + T GRID_TAIL
                    <= e^{T eta} (e^eps P[M(D') in S and G] + delta) + T GRID_TAIL
                    <= e^{eps + 2 T eta} P[M'(D') in S] + e^{T eta} delta + T GRID_TAIL,

  so M' is (eps + 2 T GRID_RATIO, e^{T GRID_RATIO} delta + T GRID_TAIL)-DP, for every eps. A ledger asks the
  accountant for epsilon at delta' = (delta - T GRID_TAIL) e^{-T GRID_RATIO} and adds 2 T GRID_RATIO.
* Poisson subsampling. If a release rounds a sum over a random batch that stays secret, k(D) is not a
  function of the transcript and G is no event of it. The same formula then holds by the other route,
  for every eps <= 2**32 and T <= 2**64 (a ledger should report a larger eps as inf). The Gaussian's
  lower bound holds for every j, so P[M'(D) in S] <= e^{T eta} P[M(D) in S] for every S (pointwise on
  the joint law of batches and noise, hence for the mixture); then P[M(D) in S] <= e^eps P[M(D') in S]
  + delta; and P[M(D') in S] <= e^{T eta} P[M'(D') in S] + T tau with the window B = 2**17, where
  tau <= d e^{1 - 2**33} bounds the chance that a continuous noise coordinate of a release leaves it.
  The extra e^{eps + T eta} T tau is <= T GRID_TAIL while eps + T eta <= 2**33 - 100. (The Laplace's
  bounds hold for every j both ways: tau = 0, every eps.)

In both cases the final conversions (int64 to float64, the multiplication by g, the cast to ``value``'s
dtype and device) are deterministic functions of the integer ``round(value / g) + Z``, i.e.
post-processing.

The range. int64 arithmetic holds |value / g| + 60 noise scales below 2**62; each coordinate of value / g
is clamped into that range (+-inf included) before the rounding, never refused by its size. A refusal
decided by the value would tell whoever sent the release's other inputs one noise-free bit about the data
(a server can push the public part of a value to the edge of the range, so that one sample decides it).
Clamping is 1-Lipschitz in each coordinate, so it never increases the L1 or L2 distance between the values
of neighbouring data sets: the mechanism above, applied to clamp(value), keeps its sensitivity and its
guarantee, and where nothing reaches the edge (|value| below about 2**30 noise scales) it changes nothing.
A NaN is refused (its text names no number): a caller whose data-dependent part is finite by construction
(clipped) gets a NaN only from its public inputs, so the refusal is decided by them. OverflowError is raised
if a noise integer reaches 2**62, an event of probability below e^-60 ~ 1e-26 per coordinate (it depends on
the noise alone; the accounting above does not count this abort).

What this module does not defend. The samplers are exact but not constant-time: the number of rejection
rounds of a draw (over the whole vector) depends on the noise, and Jin et al. show that timing can leak it.
Here a round serves many coordinates at once (up to 12000 proposals), so the time depends on the noise
mostly through batch-level aggregates (and on the rare comparisons that need exact arithmetic), but no
timing guarantee is claimed; a deployment that exposes precise timing of the local computation must add
its own padding.

The stream. :class:`Stream` reads the ChaCha20 keystream (RFC 8439; ``cryptography``'s OpenSSL binding)
under a 32-byte key with a zero 96-bit nonce and the block counter starting at 0, as little-endian uint64
words, in order. Every sampler reads the words it needs from its stream, so a draw is a deterministic
function of (key, the sequence of calls); :func:`draw_stream` gives each (agent, round, step, stream
number) its own stream, so draws never depend on what else was drawn. How many words a sampler reads is
integer arithmetic too, so a draw is the same on every platform, with one exception of probability about
2**-48 per variate: which comparisons with a float64 interval (the discrete Laplace's Bernoulli(exp(-U/t)),
the discrete Gaussian's acceptance) go to the exact path depends on numpy's exp within an ulp, and an
element that goes there reads more words (its decision, and the law, are the same anyway).
"""

from __future__ import annotations

import decimal
import functools
import hashlib
import hmac
import math
import operator
import secrets
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

if TYPE_CHECKING:  # torch is imported where a release needs it: the ledger imports this module
    import torch

__all__ = [
    "GRID_BITS", "GRID_RATIO", "GRID_TAIL", "KEY_BYTES", "MIN_GAUSSIAN_MULTIPLIER", "Stream", "bernoulli",
    "derive", "discrete_gaussian", "discrete_laplace", "draw_stream", "gaussian_log_ratio",
    "gaussian_release", "grid", "laplace_epsilon_cost", "laplace_log_ratio", "laplace_release", "new_key",
    "uniform01", "uniform_below",
]

KEY_BYTES: int = 32
GRID_BITS: int = 32  # the grid is 2**-GRID_BITS of the noise scale per coordinate (see the module docstring)
# The privacy cost of the grid (module docstring, "PRIVACY COST OF THE GRID"): per release, the deployed
# mechanism's transcript probabilities are within a factor e^GRID_RATIO of the rounded continuous
# mechanism's (outside an event of probability GRID_TAIL, for the Gaussian); a Gaussian release's noise
# multiplier must be at least MIN_GAUSSIAN_MULTIPLIER for the window of that argument.
GRID_RATIO: float = 2.0**-33
GRID_TAIL: float = 2.0**-64
MIN_GAUSSIAN_MULTIPLIER: float = 2.0**-10

# The float64 interval around exp(-gamma) in the discrete Gaussian's acceptance test is widened by this
# relative margin on each side, on top of the rigorous bound on gamma's rounding error. It must cover the
# error of numpy's exp (a few ulp, 2**-50 at most) and of the two multiplications; 2**-40 does so with room
# to spare. Tests set it larger (even above 1) so that the exact path decides most draws: any value >= the
# floor below gives the same distribution, only the share of exact decisions changes. _LAPLACE_MARGIN is the
# same for the discrete Laplace's Bernoulli(exp(-U/t)), and _GEOMETRIC_SLACK widens the (integer) undecided
# bands of its geometric count V (0: only exact ties with the thresholds are undecided); tests raise them.
_ACCEPT_MARGIN: float = 2.0**-40
_LAPLACE_MARGIN: float = 2.0**-40
_ACCEPT_MARGIN_FLOOR = 2.0**-44
_GEOMETRIC_SLACK: int = 0

_DERIVE_PREFIX = b"dpadmm.privacy.secure.derive/v1\x00"
_U64 = 2**64
_I64_MAX = 2**63 - 1
_MAX_WORDS = 2**35  # ChaCha20's 32-bit block counter: 2**32 blocks of 8 words
_ZERO_WORDS = 2**15  # the words one encryption call makes (from a shared buffer of zero bytes)
_ZEROS = bytes(8 * _ZERO_WORDS)
# Rejection loops propose about 1.03 / acceptance times what they still need, plus a few, so that one round
# almost always does. The counts are integer arithmetic (percentages), so that the words a draw reads, and
# hence its values, are the same on every platform (no libm function decides them).
_LAPLACE_PROPOSALS = 163  # per cent of (2**bits / t) need: the acceptance is >= (t / 2**bits) (1 - e^-1)
_GAUSSIAN_PROPOSALS = ((2.0, 190), (10.0, 156), (1000.0, 137), (math.inf, 136))  # sigma below: per cent
# (the acceptance of Algorithm 3 per Laplace proposal is at least 0.54, 0.66, 0.75, 0.76 on those ranges)
# Rounds handle at most this many proposals, so that a round's temporary arrays stay below 128 KiB: glibc
# serves larger ones by mmap, fresh pages that fault in on every round (costly, above all in a VM).
_ROUND = 12_000
_HUGE_GAMMA = 2**16  # exp(-gamma) < 2**-94000 above it: the exact test needs no decimal there (see below)
_RANGE_SIGMAS = 60.0  # the int64 check of a release: |value / g| + 60 noise scales <= 2**62
_INT_LIMIT = 2**62


# --------------------------------------------------------------------------- validation


def _integer(name: str, value: object, low: int, high: int) -> int:
    """``value`` as a Python int in [low, high] (bools refused)."""
    try:
        if isinstance(value, bool | np.bool_):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r} must be an integer in [{low}, {high}]") from None
    if not low <= v <= high:
        raise ValueError(f"{name}={v} is out of range; it must lie in [{low}, {high}]")
    return v


def _count(name: str, value: object) -> int:
    return _integer(name, value, 0, 2**40)


def _real(name: str, value: object) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name}={value!r} must be a real number")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name}={v} must be finite")
    return v


def _check_key(key: object) -> bytes:
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError(f"key must be {KEY_BYTES} bytes; got {type(key).__name__}")
    key = bytes(key)
    if len(key) != KEY_BYTES:
        raise ValueError(f"key must be exactly {KEY_BYTES} bytes (256 bits); got {len(key)} bytes")
    return key


# --------------------------------------------------------------------------- keys and streams


def new_key() -> bytes:
    """A fresh 32-byte secret key from the operating system's CSPRNG (:func:`secrets.token_bytes`)."""
    return secrets.token_bytes(KEY_BYTES)


def derive(key: bytes, *parts: bytes | str | int) -> bytes:
    """A 32-byte subkey: HMAC-SHA256 under ``key`` of an unambiguous encoding of ``parts``.

    The message is a fixed prefix, then for each part a one-byte type tag (``B`` bytes, ``S`` str as UTF-8,
    ``I`` int as 8 little-endian bytes), its length as 8 little-endian bytes, and its bytes. Each part is
    thus self-delimiting and typed, so two different tuples of parts never give the same message:
    ``("ab", "c")``, ``("a", "bc")``, ``(1,)``, ``("1",)`` and ``(b"\\x01",)`` all derive different keys.
    Ints must lie in [0, 2**64). HMAC-SHA256 is a PRF, so subkeys for different parts are independent
    pseudorandom keys, and none reveals ``key`` or its siblings.
    """
    key = _check_key(key)
    message = bytearray(_DERIVE_PREFIX)
    for part in parts:
        if isinstance(part, bytes | bytearray | memoryview):
            tag, data = b"B", bytes(part)
        elif isinstance(part, str):
            tag, data = b"S", part.encode("utf-8")
        else:
            if isinstance(part, bool | np.bool_):
                raise TypeError(f"derive() part {part!r} is a bool; use an int, str or bytes")
            try:
                v = operator.index(part)
            except TypeError:
                raise TypeError(f"derive() part {part!r} must be bytes, str or an int") from None
            if not 0 <= v < _U64:
                raise ValueError(f"derive() int part {v} is out of range; it must lie in [0, 2**64)")
            tag, data = b"I", v.to_bytes(8, "little")
        message += tag + len(data).to_bytes(8, "little") + data
    return hmac.new(key, bytes(message), hashlib.sha256).digest()


class Stream:
    """A ChaCha20 keystream under a 32-byte key, read sequentially as little-endian uint64 words.

    ChaCha20 as in RFC 8439 (``cryptography.hazmat.primitives.ciphers.algorithms.ChaCha20``) with a zero
    96-bit nonce and the 32-bit block counter starting at 0; the keystream is the encryption of zero bytes.
    Deterministic: the same key gives the same words in the same order, however the reads are split
    (``words(3)`` then ``words(5)`` is ``words(8)``). One stream holds 2**32 blocks, i.e. 2**35 words;
    reading past that is refused. A stream must not be shared between draws that should be independent:
    use :func:`draw_stream` to give every draw its own.
    """

    __slots__ = ("_encryptor", "_read")

    def __init__(self, key: bytes) -> None:
        key = _check_key(key)
        self._encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
        self._read = 0

    def words(self, n: int) -> np.ndarray:
        """The next ``n`` words of the keystream, uint64 [n]."""
        n = _count("n", n)
        if self._read + n > _MAX_WORDS:
            raise OverflowError(f"a Stream holds {_MAX_WORDS} words (ChaCha20's 32-bit block counter); "
                                f"{self._read} were read and {n} more were asked for")
        self._read += n
        if n <= _ZERO_WORDS:  # encrypting a shared buffer of zeros saves allocating (and faulting in) one
            raw = self._encryptor.update(memoryview(_ZEROS)[:8 * n])
            return np.frombuffer(raw, dtype="<u8").astype(np.uint64)
        out = np.empty(n, np.uint64)
        for i in range(0, n, _ZERO_WORDS):
            k = min(_ZERO_WORDS, n - i)
            out[i:i + k] = np.frombuffer(self._encryptor.update(memoryview(_ZEROS)[:8 * k]), dtype="<u8")
        return out


def draw_stream(key: bytes, agent: int, round_: int, step: int, stream: int) -> Stream:
    """The stream of one draw coordinate: ``Stream(derive(key, "dpadmm-draw", agent, round_, step, stream))``.

    The coordinates mirror those of :mod:`dpadmm.privacy.noise` (``stream`` is one of its ``STREAM_*``
    numbers), so each draw has its own independent stream and does not depend on what else was drawn.
    """
    return Stream(derive(key, "dpadmm-draw", agent, round_, step, stream))


# --------------------------------------------------------------------------- uniform integers and bits


def _below(stream: Stream, n: int, bound: int) -> np.ndarray:
    """uint64 [n] uniform on {0, ..., bound - 1} (validated bound): masked words, rejection above bound."""
    if bound == 1 or n == 0:
        return np.zeros(n, np.uint64)
    mask = (1 << (bound - 1).bit_length()) - 1
    if mask + 1 == bound:  # a power of two: no rejection
        return stream.words(n) & np.uint64(mask)
    out = np.empty(n, np.uint64)
    filled = 0
    while filled < n:  # the acceptance is bound / (mask + 1) > 1/2
        need = n - filled
        w = stream.words(need * (mask + 1) * 103 // (bound * 100) + 8) & np.uint64(mask)
        w = w[w < np.uint64(bound)]
        take = min(need, w.size)
        out[filled:filled + take] = w[:take]
        filled += take
    return out


def uniform_below(stream: Stream, n: int, bound: int) -> np.ndarray:
    """int64 [n], exactly uniform on {0, ..., bound - 1}, 1 <= bound <= 2**62.

    Each word is masked to the bit length of ``bound - 1`` and kept if below ``bound`` (rejection sampling,
    acceptance > 1/2); the kept values are used in stream order. Each round reads a few more words than it
    expects to need, so one round almost always suffices; surplus words are discarded, which keeps the
    values independent and uniform. ``bound == 1`` reads nothing.
    """
    return _below(stream, _count("n", n), _integer("bound", bound, 1, 2**62)).astype(np.int64)


def bernoulli(stream: Stream, n: int, rate: float) -> np.ndarray:
    """bool [n] with P(True) = ``rate``, exactly, for the binary value of the float ``rate`` in [0, 1].

    If ``rate * 2**64`` is an integer M (every rate >= 2**-12 and every multiple of 2**-64) an element is
    ``word < M``. Otherwise it compares a 128-bit uniform with M = floor(rate * 2**128), lazily: a word per
    element is its high half and decides unless it equals M's high half; only then (probability 2**-64) is
    a low half read, after the n high words, in element order. So P(True) = M / 2**128, exactly ``rate``
    for every float64 rate >= 2**-76 (whose binary expansion ends at or above 2**-128); for smaller rates
    it is floor(rate * 2**128) / 2**128 <= rate, short by less than 2**-128. Rates 0 and 1 read no words.
    """
    n = _count("n", n)
    rate = _real("rate", rate)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate={rate} is out of range; it must lie in [0, 1]")
    if rate == 0.0 or n == 0:
        return np.zeros(n, bool)
    if rate == 1.0:
        return np.ones(n, bool)
    exact = Fraction(rate)
    scaled = exact * _U64
    w = stream.words(n)
    if scaled.denominator == 1:
        return w < np.uint64(int(scaled))
    m = math.floor(exact * _U64 * _U64)
    hi, lo = np.uint64(m >> 64), np.uint64(m & (_U64 - 1))
    out = w < hi
    tie = np.flatnonzero(w == hi)
    if tie.size:
        out[tie] = stream.words(tie.size) < lo
    return out


def uniform01(stream: Stream, n: int) -> np.ndarray:
    """float64 [n] in (0, 1): k 2**-53 with k the top 53 bits of a word, k = 0 giving 2**-54.

    For the non-noise uses of randomness (random weights, orderings). Privacy noise must not be made from
    it by floating-point transforms: that is exactly what the attacks cited in the module docstring read.
    """
    k = stream.words(_count("n", n)) >> np.uint64(11)
    u = k.astype(np.float64) * 2.0**-53
    u[k == 0] = 2.0**-54
    return u


# ------------------------------------------------------------------- exact comparisons with exp(-gamma)


def _check_margin(name: str, margin: float) -> float:
    margin = float(margin)
    if not margin >= _ACCEPT_MARGIN_FLOOR:
        raise ValueError(f"{name}={margin} is below {_ACCEPT_MARGIN_FLOOR}, which the float64 error analysis "
                         "of the fast comparisons with exp(-gamma) needs")
    return margin


def _interval_test(w: np.ndarray, p_lo: np.ndarray, p_hi: np.ndarray, margin: float) -> tuple[np.ndarray,
                                                                                              np.ndarray]:
    """(certainly True, undecided), bool arrays, for W < p, W a uniform real whose top 64 bits are ``w``.

    p is known through float64 arrays p_lo, p_hi with p_lo (1 - margin) (1 + 2**-50) <= p <= p_hi
    (1 + margin) (1 - 2**-50) wherever p_lo, p_hi are normal floats, and p < 2**-54 wherever p_hi is not
    (an underflow); margin >= 2**-44. The top 53 bits k of w (an integer, exact in float64) place W in
    [k 2**-53, (k + 1) 2**-53). With A = fl(p_lo fl(1 - margin) 2**53) and B = fl(p_hi fl(1 + margin) 2**53)
    (each within a factor 1 +- 2**-52 of p_lo (1 - margin) 2**53, p_hi (1 + margin) 2**53 where normal),
    W < p is certain if k + 1 <= A (then W < (k + 1) 2**-53 <= A 2**-53 <= p; A >= 1 needs p_lo normal; a
    margin >= 1 makes A <= 0 and accepts nothing), and W >= p is certain if k >= max(B, 1/2): for B >= 1/2,
    W >= k 2**-53 >= B 2**-53 >= p; for B < 1/2 the test reads k >= 1, W >= 2**-53 > p, as p < 2**-54
    then (from B if p_hi is normal). The rest, a share of about 2 margin p + 2**-52, is undecided.
    """
    k = (w >> np.uint64(11)).view(np.int64).astype(np.float64)
    sure = k + 1.0 <= p_lo * ((1.0 - margin) * 2.0**53)  # a negative bound (margin > 1) accepts nothing
    undecided = k < np.maximum(p_hi * ((1.0 + margin) * 2.0**53), 0.5)
    undecided &= ~sure
    return sure, undecided


def _exp_neg_bounds(gamma: Fraction, digits: int) -> tuple[Fraction, Fraction]:
    """Rationals lo <= exp(-gamma) <= hi, hi - lo = 2 eta e with e ~ exp(-gamma), eta defined below.

    ``decimal`` at precision prec = digits + the digits of ceil(gamma) computes g = gamma and e = exp(-g),
    each correctly rounded (relative errors r/gamma, eps <= 0.5 10**(1-prec)); then
    exp(-gamma) / e lies within 1 +- 1.1 (r + eps) <= 1 +- (ceil(gamma) + 2) 10**(1-prec) =: 1 +- eta.
    The exponent range is the largest decimal allows, so e underflows only for gamma above ~2e18.
    """
    if gamma == 0:
        return Fraction(1), Fraction(1)
    whole = math.ceil(gamma)
    prec = digits + len(str(whole))
    ctx = decimal.Context(prec=prec, rounding=decimal.ROUND_HALF_EVEN, Emin=decimal.MIN_EMIN,
                          Emax=decimal.MAX_EMAX,
                          traps=[decimal.InvalidOperation, decimal.DivisionByZero, decimal.Overflow,
                                 decimal.Underflow])
    g = ctx.divide(decimal.Decimal(gamma.numerator), decimal.Decimal(gamma.denominator))
    e = Fraction(ctx.exp(ctx.minus(g)))
    eta = Fraction(whole + 2, 10 ** (prec - 1))
    return e * (1 - eta), e * (1 + eta)


def _exact_below_exp(stream: Stream, a: int, bits: int, gamma: Fraction) -> tuple[bool, int, int]:
    """Whether W < exp(-gamma), decided exactly; also the bits of W known afterwards, as (answer, a, bits).

    W is the uniform real whose binary expansion starts with the ``bits`` bits of ``a`` (the words already
    read for it) and continues with fresh words of the stream, 128 bits at a time, read only while needed.
    W lies in [a 2**-L, (a + 1) 2**-L) after L bits; the answer is True once (a + 1) 2**-L <= lo and False
    once a 2**-L >= hi, with [lo, hi] a rational interval around exp(-gamma) (:func:`_exp_neg_bounds`)
    tightened as L grows. So P(True) = exp(-gamma) exactly, and the loop ends with probability 1. A caller
    that compares the same W with another threshold passes the returned (a, bits) on.
    """
    while True:
        if gamma > _HUGE_GAMMA and bits < 90_000:  # exp(-gamma) < e^-65536 < 2**-94000: W >= it unless 0
            lo, hi = Fraction(0), Fraction(1, 1 << 90_000)
        else:
            lo, hi = _exp_neg_bounds(gamma, bits * 30103 // 100000 + 20)
        if (a + 1) * lo.denominator <= lo.numerator << bits:
            return True, a, bits
        if a * hi.denominator >= hi.numerator << bits:
            return False, a, bits
        w = stream.words(2)
        a = (a << 128) | (int(w[0]) << 64) | int(w[1])
        bits += 128


def _exp_floor_table() -> tuple[int, ...]:
    """c_k = floor(e^{-k} 2**64) for k = 1, 2, ... up to the first that is 0 (k = 45), exactly.

    e^{-k} is irrational, so e^{-k} 2**64 is never an integer, and rational bounds of it from
    :func:`_exp_neg_bounds`, tightened until both have the same floor, give that floor.
    """
    table: list[int] = []
    while not table or table[-1]:
        gamma, digits = Fraction(len(table) + 1), 40
        while True:
            lo, hi = _exp_neg_bounds(gamma, digits)
            if math.floor(lo * _U64) == math.floor(hi * _U64):
                break
            digits += 20
        table.append(math.floor(lo * _U64))
    return tuple(table)


_EXP_FLOORS = _exp_floor_table()


# --------------------------------------------------------------------------- CKS samplers


def _bern_exp_ratio(stream: Stream, u: np.ndarray, w: np.ndarray, t: int, valid: np.ndarray) -> np.ndarray:
    """bool: W < exp(-u / t) where ``valid`` (else False), W a uniform real whose top 64 bits are ``w``.

    The Bernoulli(exp(-U / t)) of CKS Algorithm 2, for uint64 u < t where valid (their Algorithm 1 builds
    it from a loop of Bernoulli trials of rational rates). As P(W < p) = p for the uniform real W, one
    comparison per element decides it, through a float64 interval that provably contains p = exp(-gamma),
    gamma = u / t < 1. With round-to-nearest (relative error <= 2**-53 per operation; u < 2**61 converts
    through int64), gamma_f = fl(fl(u) fl(-1 / fl(t))) is within 4.01 2**-53 gamma < 2**-50 of gamma, so
    e = fl(exp(-gamma_f)) is within a factor e^{+-2**-50} (1 +- 2**-50) of p, numpy's exp erring by at most
    2**-50 (a few ulp), and :func:`_interval_test` with p_lo = p_hi = e and margin = _LAPLACE_MARGIN
    (>= 2**-44, which covers the rest) decides every element but a share of about 2 margin. Those are
    decided by :func:`_exact_below_exp`, which reads more words of their W from the stream, in element
    order. Which elements go there depends on numpy's exp within an ulp (module docstring, "The stream");
    the decisions, and so the law, do not.
    """
    margin = _check_margin("_LAPLACE_MARGIN", _LAPLACE_MARGIN)
    e = u.view(np.int64).astype(np.float64)  # u < 2t <= 2**61 here
    e *= -1.0 / float(t)
    np.exp(e, out=e)  # >= e^-2: no underflow
    out, undecided = _interval_test(w, e, e, margin)
    out &= valid
    if undecided.any():
        for i in np.flatnonzero(undecided & valid).tolist():
            out[i] = _exact_below_exp(stream, int(w[i]), 64, Fraction(int(u[i]), t))[0]
    return out


@functools.lru_cache(maxsize=8)
def _geometric_bands(slack: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint64 lo_k = max(c_k - slack, 0) and width_k = min(c_k + slack, 2**64 - 1) - lo_k for k = 1..45
    (at index k - 1), and lo_k in ascending order (k = 45..1)."""
    lo = [max(c - slack, 0) for c in _EXP_FLOORS]
    width = [min(c + slack, _U64 - 1) - low for c, low in zip(_EXP_FLOORS, lo, strict=True)]
    return np.array(lo, np.uint64), np.array(width, np.uint64), np.array(lo[::-1], np.uint64)


def _geometric(stream: Stream, m: int) -> np.ndarray:
    """int64 [m]: V with P(V >= k) = e^{-k} (k = 0, 1, ...), the V of CKS Algorithm 2, from one word each.

    CKS count the successes of Bernoulli(exp(-1)) trials before the first failure. Equivalently, V is the
    number of k >= 1 with W < e^{-k}, W a uniform real: P(V >= k) = P(W < e^{-k}) = e^{-k}. The word w of
    an element is the top 64 bits of its W, and it is compared with the exact integers c_k = floor(e^{-k}
    2**64) (``_EXP_FLOORS``, decreasing, c_45 = 0): w < c_k implies W < (w + 1) 2**-64 <= e^{-k}, and
    w > c_k implies W >= w 2**-64 > e^{-k}, as e^{-k} 2**64 is not an integer. So w decides V unless it
    equals c_k for the first k that w is not below (probability about 2**-64), and then W is continued with
    stream words and compared with e^{-k}, e^{-k-1}, ... exactly (:func:`_exact_below_exp`), in element
    order after the m words. No floating point decides anything: the words read and the values are the same
    on every platform. Tests widen the undecided band to c_k - slack <= w <= c_k + slack
    (``_GEOMETRIC_SLACK``); every slack >= 0 gives the same law, only the share of exact decisions changes.
    """
    slack = _integer("_GEOMETRIC_SLACK", _GEOMETRIC_SLACK, 0, _U64 - 1)
    lo, width, ascending = _geometric_bands(slack)
    w = stream.words(m)
    # v = the number of k with w < lo_k (all of them certainly below), by a binary search in integers
    v = len(ascending) - np.searchsorted(ascending, w, side="right")
    # the first k not certainly below is k = v + 1 <= 45 (lo_45 = 0): above it for sure, or undecided
    undecided = np.flatnonzero((w - lo[v]) <= width[v])  # lo_k <= w <= lo_k + width_k (wrapping if w < lo_k)
    for i in undecided.tolist():
        a, bits, k = int(w[i]), 64, int(v[i]) + 1
        while True:
            below_k, a, bits = _exact_below_exp(stream, a, bits, Fraction(k))
            if not below_k:
                break
            k += 1
        v[i] = k - 1
    return v


def _laplace(stream: Stream, n: int, t: int) -> np.ndarray:
    """int64 [n]: CKS Algorithm 2 with s = 1 (see :func:`discrete_laplace`), vectorised over rounds."""
    out = np.empty(n, np.int64)
    size = 1 << (t - 1).bit_length()  # the power of two at least t: U is a masked word, kept below t
    mask = np.uint64(size - 1)
    largest_v = (_I64_MAX - (t - 1)) // t  # U + t V fits in int64 for every U < t if V is at most this
    filled = 0
    while filled < n:
        need = n - filled
        m = min(need * size * _LAPLACE_PROPOSALS // (t * 100) + 16, _ROUND)
        w = stream.words(m)
        u = w & mask
        d = _bern_exp_ratio(stream, u, stream.words(m), t, u < np.uint64(t))  # U < t, D ~ Bern(exp(-U / t))
        sel = np.flatnonzero(d)
        u, b = u[sel], w[sel] >= np.uint64(1 << 63)  # B: the top bit of U's word (U uses <= 60 bits)
        v = _geometric(stream, sel.size)
        zero = np.flatnonzero(u == 0)
        drop = zero[b[zero] & (v[zero] == 0)]  # reject B = 1, U = V = 0 (else 0 would count twice)
        if drop.size:
            u, b, v = np.delete(u, drop), np.delete(b, drop), np.delete(v, drop)
        take = min(need, u.size)
        u, b, v = u[:take].view(np.int64), b[:take], v[:take]  # u < t <= 2**60
        if take and int(v.max()) > largest_v and np.any(v > (_I64_MAX - u) // t):
            raise OverflowError(f"a discrete Laplace variate of scale {t} exceeded int64 (an event of "
                                f"probability about exp(-2**63 / scale) per variate); use a smaller scale")
        z = u + v * t
        out[filled:filled + take] = np.where(b, -z, z)
        filled += take
    return out


def discrete_laplace(stream: Stream, n: int, scale: int) -> np.ndarray:
    """int64 [n], P(k) = (1 - e^{-1/t}) / (1 + e^{-1/t}) exp(-|k| / t) exactly, t = ``scale`` in [1, 2**60].

    Canonne, Kamath and Steinke (NeurIPS 2020), Algorithm 2 with s = 1, t = scale: U uniform on
    {0..t-1}; reject unless D ~ Bernoulli(exp(-U/t)); V with P(V >= k) = e^{-k}; B a fair bit; reject if
    B = 1 and U = V = 0; return (1 - 2B)(U + t V). (U + t V is geometric: P(U + t V >= j) = e^{-j/t}.)
    Each proposal reads two words: the first gives U (its low bits, masked to the bit length of t - 1, the
    proposal rejected if U >= t) and B (its top bit), the second the top 64 bits of a uniform real W with
    D = [W < exp(-U/t)] (:func:`_bern_exp_ratio`: a float64 interval around exp(-U/t) decides all but a
    share of about 2**-39, exact arithmetic the rest). An accepted proposal reads one more word for V,
    decided by exact integer thresholds (:func:`_geometric`). So the distribution is exact, and the value
    is integer arithmetic on stream words (no floating point touches a variate; it only sorts out which
    comparisons need exact arithmetic). Vectorised: each round proposes slightly more candidates than the
    expected acceptance needs (at least (t / 2**bits) (1 - e^{-1}) with the rejection of 0, bits the bit
    length of t - 1) and keeps the first accepted ones in order.

    |k| >= 2**63 cannot be returned: it raises OverflowError, which at scale t has probability about
    exp(-2**63 / t) per variate (e^-8 at t = 2**60; nil at the scales the releases use).
    """
    return _laplace(stream, _count("n", n), _integer("scale", scale, 1, 2**60))


def _exact_accept(stream: Stream, abs_y: int, v: int, sigma: Fraction, t: int) -> bool:
    """Whether W < exp(-gamma), gamma = (abs_y - sigma^2/t)^2 / (2 sigma^2), decided exactly.

    W is the uniform real whose binary expansion starts with the 64 bits of ``v`` and continues with fresh
    words of the stream (:func:`_exact_below_exp`). P(True) = exp(-gamma) exactly.
    """
    gamma = (abs_y - sigma * sigma / t) ** 2 / (2 * sigma * sigma)
    return _exact_below_exp(stream, v, 64, gamma)[0]


def _accept_gaussian(stream: Stream, y: np.ndarray, sigma: float, t: int) -> np.ndarray:
    """bool: Bernoulli(exp(-gamma)) per element, gamma = (|y| - sigma^2/t)^2 / (2 sigma^2), exactly.

    A 64-bit word V per element gives the top bits of a uniform real W; the answer is W < exp(-gamma).
    In float64, with u = 2**-53: a = fl(|y|), b = fl(fl(sigma sigma) / fl(t)), c = fl(a - b),
    gamma_f = fl(fl(c c) / (2 fl(sigma sigma))). Each operation has relative error <= u, so b is within
    3.01 u of sigma^2/t, c within 4.1 u (|y| + sigma^2/t) of |y| - sigma^2/t, and
    |gamma_f - gamma| <= 6 u M^2 / sigma^2 with M = |y| + sigma^2/t (6 u < 2**-50). We use
    dg = 2**-49 (a + b)^2 / fl(sigma sigma), which also covers the rounding of gamma_f +- dg itself (it is at
    least 2**-48 gamma_f). Then p_lo = exp(-(gamma_f + dg)) <= exp(-gamma) <= p_hi = exp(-(gamma_f - dg)),
    up to numpy's exp (a few ulp, 2**-50), and :func:`_interval_test` with margin = _ACCEPT_MARGIN
    (>= 2**-44) accepts or rejects all but a share of about 2 margin (when p_hi underflows, gamma > 700
    and exp(-gamma) < 2**-1000, as that test needs). The rest is decided by :func:`_exact_accept`, in
    element order.
    """
    margin = _check_margin("_ACCEPT_MARGIN", _ACCEPT_MARGIN)
    v = stream.words(y.size)
    abs_y = np.abs(y)
    a = abs_y.astype(np.float64)
    s2 = sigma * sigma
    b = s2 / t
    c = a - b
    gamma = c * c / (2.0 * s2)
    a += b
    dg = a * a
    dg *= 2.0**-49 / s2  # two roundings more than 2**-49 (a + b)^2 / s2: 2**-49 > 2.6 (6 u) covers them
    with np.errstate(under="ignore", over="ignore"):
        p_lo = np.exp(-(gamma + dg))
        gamma -= dg
        np.negative(gamma, out=gamma)
        p_hi = np.exp(gamma, out=gamma)
    accept, undecided = _interval_test(v, p_lo, p_hi, margin)
    if undecided.any():
        sigma_q = Fraction(sigma)
        for i in np.flatnonzero(undecided).tolist():
            accept[i] = _exact_accept(stream, int(abs_y[i]), int(v[i]), sigma_q, t)
    return accept


def _gaussian(stream: Stream, n: int, sigma: float) -> np.ndarray:
    out = np.empty(n, np.int64)
    t = math.floor(sigma) + 1
    # the acceptance of a Laplace proposal is tanh(1/(2t)) e^{-sigma^2/(2t^2)} sum_k e^{-k^2/(2 sigma^2)}
    per_cent = next(pc for below, pc in _GAUSSIAN_PROPOSALS if sigma < below)
    filled = 0
    while filled < n:
        need = n - filled
        y = _laplace(stream, min(need * per_cent // 100 + 16, _ROUND), t)
        y = y[_accept_gaussian(stream, y, sigma, t)][:need]
        out[filled:filled + y.size] = y
        filled += y.size
    return out


def discrete_gaussian(stream: Stream, n: int, sigma: float) -> np.ndarray:
    """int64 [n], P(k) proportional to exp(-k^2 / (2 sigma^2)) exactly, 1 <= sigma <= 2**57.

    Canonne, Kamath and Steinke (NeurIPS 2020), Algorithm 3: with t = floor(sigma) + 1, propose Y from
    the discrete Laplace of scale t (:func:`discrete_laplace`) and accept it with probability exp(-gamma),
    gamma = (|Y| - sigma^2/t)^2 / (2 sigma^2); otherwise propose again. ``sigma`` is taken as the exact
    binary value of the float. The acceptance is exact, not float-close: a uniform real W, of which the
    stream gives 64 bits at a time, is compared with exp(-gamma) through a float64 interval that provably
    contains it (see ``_accept_gaussian`` for the error bound), and the rare cases the interval cannot
    decide (W within about 2**-40 relative of exp(-gamma)) are decided with more bits of W against exp(-gamma)
    computed by :mod:`decimal` from gamma as an exact fraction, tightened until decided. The overall
    acceptance is about 0.76 for large sigma; each round proposes a little more than it expects to need.
    The bound on sigma keeps the Laplace proposals inside int64 (an overflow, refused with OverflowError,
    has probability about e^-64 per proposal at sigma = 2**57).
    """
    n = _count("n", n)
    sigma = _real("sigma", sigma)
    if not 1.0 <= sigma <= 2.0**57:
        raise ValueError(f"sigma={sigma} is out of range; it must lie in [1, 2**57]")
    return _gaussian(stream, n, sigma)


# --------------------------------------------------------------------------- releases


def _floor_log2(x: Fraction) -> int:
    """floor(log2 x) for a rational x > 0, exactly."""
    p, q = x.numerator, x.denominator
    k = p.bit_length() - q.bit_length()  # x in (2**(k-1), 2**(k+1))
    at_least = (q << k) <= p if k >= 0 else q <= (p << -k)
    return k if at_least else k - 1


def grid(kind: str, spread: float, d: int) -> float:
    """The grid step g of a release of ``d`` coordinates with noise ``spread`` (Laplace scale / Gaussian std).

    The largest power of two with ``d * g <= 2**-GRID_BITS * spread`` (kind ``"laplace"``: the rounding's
    L1 cost) or ``sqrt(d) * g <= 2**-GRID_BITS * spread`` (kind ``"gaussian"``: its L2 cost), computed
    exactly with rationals. Refused if g would fall below the normal float64 range.
    """
    if kind not in ("laplace", "gaussian"):
        raise ValueError(f"kind={kind!r} is not allowed; choose 'laplace' or 'gaussian'")
    spread = _real("spread", spread)
    if not spread > 0:
        raise ValueError(f"spread={spread} must be > 0")
    d = _integer("d", d, 1, 2**62)
    if kind == "laplace":
        k = _floor_log2(Fraction(spread) / (d << GRID_BITS))
    else:  # 4**k d <= spread^2 2**(-2 GRID_BITS)
        k = _floor_log2(Fraction(spread) ** 2 / (d << (2 * GRID_BITS))) // 2
    if k < -1022:
        raise ValueError(f"a {kind} release of {d} coordinates with noise {spread} needs a grid of 2**{k}, "
                         "below the normal float64 range; scale the value up")
    return math.ldexp(1.0, k)


def _release(value: torch.Tensor, kind: str, spread: float, stream: Stream) -> torch.Tensor:
    import torch

    if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
        raise TypeError(f"value must be a floating-point tensor; got {type(value).__name__}"
                        + (f" of dtype {value.dtype}" if isinstance(value, torch.Tensor) else ""))
    what = "scale" if kind == "laplace" else "std"
    spread = _real(what, spread)
    if spread == 0.0:
        raise ValueError(f"{what}=0: a release without noise is not a mechanism of this module; "
                         "handle the non-private case in the caller")
    if not spread > 0:
        raise ValueError(f"{what}={spread} must be > 0")
    d = value.numel()
    if d == 0:
        return value.detach().clone()
    g = grid(kind, spread, d)
    x = value.detach().to(device="cpu", dtype=torch.float64).reshape(-1).numpy()
    if np.isnan(x).any():
        # no number computed from the value in the text: a deployed node's error reaches the server
        raise ValueError("value has a NaN entry; a release needs numbers")
    noise = float(math.ceil(spread / g)) if kind == "laplace" else spread / g  # in grid units
    limit = float(_INT_LIMIT) - _RANGE_SIGMAS * noise
    if limit <= 0:
        raise ValueError(f"a {kind} release of {d} coordinates needs noise of {noise:.4g} grid steps, so "
                         "large that int64 arithmetic cannot hold it; release fewer coordinates at a time")
    # exact (g is a power of two; a value small enough to underflow rounds to 0 anyway), then clamped into
    # int64's range: 1-Lipschitz, so the sensitivity holds and no value is refused for its size
    with np.errstate(over="ignore"):  # a value beyond float64 / g is +-inf here, clamped like the rest
        q = np.clip(x / g, -limit, limit)
    k = np.rint(q).astype(np.int64)  # round half to even: exact
    z = _laplace(stream, d, int(noise)) if kind == "laplace" else _gaussian(stream, d, noise)
    if np.abs(z).max() >= _INT_LIMIT:
        raise OverflowError(f"a {kind} noise integer reached 2**62 (probability below e^-60); no release")
    out = (k + z).astype(np.float64) * g
    return torch.from_numpy(out).reshape(value.shape).to(dtype=value.dtype, device=value.device)


def laplace_release(value: torch.Tensor, scale: float, stream: Stream) -> torch.Tensor:
    """``value`` plus Laplace noise of scale >= ``scale`` per coordinate, on a grid, floating-point safe.

    With d = value.numel() and g = grid("laplace", scale, d): g (round(value / g) + Z), Z a vector of
    discrete Laplace variates of scale t = ceil(scale / g) (:func:`discrete_laplace`). value / g is exact,
    the rounding (half to even) is exact, Z is added in int64, and the integer is turned into float64, times
    g, then cast to value's dtype and device, all post-processing. So the output depends on ``value`` only
    through round(value / g), never on its lower bits. Privacy: pure (Delta / scale + 2**-GRID_BITS)-DP for
    L1 sensitivity Delta (:func:`laplace_epsilon_cost`); under composition and subsampling, whatever holds
    for the continuous mechanism at multiplier 1 / (Delta / scale + 2**-GRID_BITS), with 2 GRID_RATIO more
    epsilon and a factor e^GRID_RATIO on delta per release (module docstring). Any shape; the same shape
    is returned. scale = 0 is refused: a release without noise is the caller's business. The grid makes t
    between d 2**32 and d 2**33, so the int64 check (60 t <= 2**62) limits a Laplace release to about 2**23
    (8 million) coordinates; a Gaussian release's s = std / g < 2 sqrt(d) 2**32 allows up to about 2**46.
    """
    return _release(value, "laplace", scale, stream)


def gaussian_release(value: torch.Tensor, std: float, stream: Stream) -> torch.Tensor:
    """``value`` plus Gaussian noise of standard deviation ``std`` per coordinate, on a grid, float-safe.

    With d = value.numel() and g = grid("gaussian", std, d): g (round(value / g) + Z), Z a vector of
    discrete Gaussians of parameter std / g (exact: g is a power of two; :func:`discrete_gaussian`), computed
    as in :func:`laplace_release`. Privacy: for the multiplier z = std / Delta >= MIN_GAUSSIAN_MULTIPLIER
    (L2 sensitivity Delta), whatever holds for the continuous Gaussian mechanism at multiplier
    1 / (1/z + 2**-GRID_BITS), with 2 GRID_RATIO more epsilon, a factor e^GRID_RATIO on delta and GRID_TAIL
    more delta per release (module docstring; with Poisson subsampling, for epsilon <= 2**32). std = 0 is
    refused. Values up to about 2**62 g - 60 std (some 2**29 std / sqrt(d)) can be released.
    """
    return _release(value, "gaussian", std, stream)


# --------------------------------------------------------------------------- privacy cost of the grid


def laplace_epsilon_cost() -> float:
    """What the grid adds to the epsilon of one Laplace release, as pure DP: 2**-GRID_BITS (no delta)."""
    return 2.0**-GRID_BITS


def laplace_log_ratio(t: int) -> float:
    """A bound on |ln(r(j) / p(j))| over all integers j, for the discrete Laplace of scale t >= 1.

    p is the discrete Laplace pmf, proportional to exp(-|j| / t), and r that of round(N), N the continuous
    Laplace of scale t. The bound is 1/(4t) (module docstring: r/p is cosh(1/(2t)) off 0 and
    (1 + e^{-1/t}) / (1 + e^{-1/(2t)}) at 0), rounded up; it is attained to O(1/t^2) at j = 0.
    """
    t = _integer("t", t, 1, 2**1000)
    return 0.25 / t * (1.0 + 2.0**-50)


def gaussian_log_ratio(s: float, bound: float) -> float:
    """A bound on |ln(r(j) / p(j))| over the integers |j| <= bound * s, for the discrete Gaussian, s >= 1.

    p is the discrete Gaussian pmf, proportional to exp(-j^2 / (2 s^2)), and r that of round(N),
    N ~ N(0, s^2). The bound is max(1/(24 s^2 - 1), bound^2 / (24 s^2) + 2q/(1 - q)),
    q = exp(-2 pi^2 s^2) (module docstring), rounded up. Its first term bounds ln(p/r) at every j.
    """
    s = _real("s", s)
    if not s >= 1.0:
        raise ValueError(f"s={s} must be >= 1")
    bound = _real("bound", bound)
    if not bound >= 0:
        raise ValueError(f"bound={bound} must be >= 0")
    s2 = s * s
    q = math.exp(-2.0 * math.pi**2 * s2)
    return max(1.0 / (24.0 * s2 - 1.0), bound * bound / (24.0 * s2) + 2.0 * q / (1.0 - q)) * (1.0 + 2.0**-40)
