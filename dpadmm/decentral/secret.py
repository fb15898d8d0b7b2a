"""Algorithm 3 of paper 004 (Appendix A, Theorem 2.1): the sum of N agents' vectors by additive secret
sharing, so that no coalition of at most N - 2 agents learns more than the sum.

The protocol, per exchange (one extra communication round per iteration):

1. Each agent i encodes its real vector v_i (e.g. A_i x_i^k) as integers modulo p (:class:`FixedPoint`)
   and splits it into N shares that add up to it modulo p (:func:`split`): N - 1 drawn uniformly from
   Z_p, one the residual. Share j goes to agent j over a pairwise secure channel (encrypted with a
   shared symmetric key if the network can be eavesdropped, possibly relayed); the residual is the share
   the agent keeps, s_ii. (The paper makes s_i1 the residual; which index holds it does not change the
   distribution of any N - 1 shares. Keeping it means that what agent i sends does not depend on v_i at
   all, not even through the seed.)
2. Each agent sums the N shares it holds, s_hat_j = sum_i s_ij mod p, and broadcasts it
   (:func:`partial_sums`).
3. Everyone adds the broadcasts: sum_j s_hat_j = sum_i v_i mod p (eq. (15); :func:`reconstruct`), and
   decodes.

Theorem 2.1: with N >= 3 and at most N - 2 colluding, honest-but-curious agents (they follow the
protocol), each honest agent's vector is information-theoretically hidden beyond the sum: any N - 1
shares of a vector are independent uniform elements of Z_p, and the broadcasts of two or more honest
agents are uniform given their sum. The paper's own caveat: only the exchange is protected, not what the
converged output reveals. With N - 1 colluders the last agent's value is the sum minus theirs.

Arithmetic. numpy int64 with a modulus p <= 2^62, reduced after every addition, so that the sum of two
residues (< 2^63) never overflows; the default p = 2^61 - 1 is a (Mersenne) prime. Reals are encoded in
fixed point, round(v * scale) (default scale 2^20, a resolution of about 1e-6), negative values as p - |.|
(Appendix A's Algorithm 3 asks p above the largest |sum|; signed values need p above TWICE the largest
|sum| times the scale). Each agent's value must stay within :attr:`FixedPoint.bound` so that the signed sum
of N of them decodes.

Randomness. The uniform shares come from what the caller passes: in simulation a seeded
:class:`numpy.random.Generator` (reproducible runs); in deployment a
:class:`~dpadmm.privacy.secure.Stream`, ChaCha20 under a fresh key from the OS CSPRNG
(``secure.Stream(secure.new_key())``), whose values are exactly uniform below p
(:func:`~dpadmm.privacy.secure.uniform_below`). Not ``numpy.random.default_rng()``: PCG64 is no
cryptographic generator (its state follows from enough of its outputs, and agents see many shares), and a
generator seeded from a value others know is no secret at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpadmm.privacy import secure

DEFAULT_SCALE = 2**20
DEFAULT_MODULUS = 2**61 - 1  # a Mersenne prime
MAX_MODULUS = 2**62  # two residues then add up to less than 2^63: no int64 overflow


@dataclass(frozen=True)
class FixedPoint:
    """The encoding of N agents' real values into Z_p: round(v * scale) mod p, decoded from the signed range
    (-(p - 1)/2 .. (p - 1)/2)."""

    agents: int  # N, the number of agents whose values are summed
    scale: int = DEFAULT_SCALE  # a value's resolution is 1/scale
    modulus: int = DEFAULT_MODULUS  # p

    def __post_init__(self) -> None:
        if not isinstance(self.agents, int | np.integer) or self.agents < 3:
            raise ValueError(f"agents={self.agents!r} is not allowed; secret sharing (Theorem 2.1 of 004) "
                             "needs N >= 3, so that N - 2 >= 1 colluders leave two honest agents")
        if not isinstance(self.scale, int | np.integer) or self.scale < 1:
            raise ValueError(f"scale={self.scale!r} is not allowed; give an integer >= 1 (e.g. 2**20)")
        integer = isinstance(self.modulus, int | np.integer)
        if not integer or not 2 * self.agents < self.modulus <= MAX_MODULUS:
            raise ValueError(f"modulus={self.modulus!r} is not allowed; give an integer p with 2N = "
                             f"{2 * self.agents} < p <= 2**62 (int64 arithmetic), e.g. 2**61 - 1")

    @property
    def limit(self) -> int:
        """The largest |encoded value| of one agent: N of them sum to at most (p - 1)/2 in absolute value."""
        return (self.modulus - 1) // 2 // self.agents

    @property
    def _float_limit(self) -> float:
        """:attr:`limit` rounded DOWN to a float64 (above 2^53 not every integer is one)."""
        top = float(self.limit)
        return math.nextafter(top, 0.0) if int(top) > self.limit else top

    @property
    def bound(self) -> float:
        """The largest |value| one agent may hold: limit / scale (the limit rounded down to a float)."""
        return self._float_limit / self.scale

    def encode(self, values: np.ndarray | float) -> np.ndarray:
        """round(values * scale) mod p, int64 (any shape). A ValueError names the first value beyond
        :attr:`bound` (or not finite)."""
        values = np.asarray(values, dtype=np.float64)
        scaled = np.rint(values * self.scale)
        bad = ~(np.abs(scaled) <= self._float_limit)  # catches NaN too; compared as floats, exactly
        if bad.any():
            first = float(values[bad].flat[0])
            raise ValueError(f"value {first!r} is not allowed; with {self.agents} agents, scale {self.scale} "
                             f"and modulus {self.modulus} each value must be finite with |value| <= "
                             f"{self.bound:.6g} (a larger modulus or a smaller scale holds more)")
        return np.mod(scaled.astype(np.int64), self.modulus)

    def decode(self, field: np.ndarray | int) -> np.ndarray:
        """The real values of residues in [0, p): those above (p - 1)/2 are negative; then / scale."""
        field = np.asarray(field, dtype=np.int64)
        if ((field < 0) | (field >= self.modulus)).any():
            raise ValueError(f"residues outside [0, {self.modulus}) are not allowed (first: "
                             f"{field[(field < 0) | (field >= self.modulus)].flat[0]})")
        signed = np.where(field > (self.modulus - 1) // 2, field - self.modulus, field)
        return signed.astype(np.float64) / self.scale


def _add(total: np.ndarray, term: np.ndarray, modulus: int) -> np.ndarray:
    """(total + term) mod p for residues < p <= 2^62: the sum stays below 2^63."""
    return np.mod(total + term, modulus)


def _check(field: np.ndarray, modulus: int) -> np.ndarray:
    field = np.asarray(field)
    if field.dtype != np.int64:
        raise ValueError(f"residues of dtype {field.dtype} are not allowed; give int64 (FixedPoint.encode)")
    if not 2 < modulus <= MAX_MODULUS:
        raise ValueError(f"modulus={modulus!r} is not allowed; give 2 < p <= 2**62")
    if ((field < 0) | (field >= modulus)).any():
        raise ValueError(f"residues outside [0, {modulus}) are not allowed")
    return field


def split(encoded: np.ndarray, owner: int, agents: int, modulus: int,
          rng: np.random.Generator | secure.Stream) -> np.ndarray:
    """The N additive shares of one agent's encoded vector, [N, *shape]: share j goes to agent j. The N - 1
    shares sent are uniform on Z_p (drawn from ``rng``, whatever the vector: a seeded generator in
    simulation, a ChaCha20 stream in deployment); the one the owner keeps is the residual encoded - sum of
    the others (mod p)."""
    encoded = _check(encoded, modulus)
    if agents < 3:
        raise ValueError(f"agents={agents!r} is not allowed; Theorem 2.1 needs N >= 3")
    if not 0 <= owner < agents:
        raise ValueError(f"owner={owner!r} is not allowed; give an agent in 0..{agents - 1}")
    shape = (agents, *encoded.shape)
    if isinstance(rng, secure.Stream):
        shares = secure.uniform_below(rng, math.prod(shape), modulus).reshape(shape)
    elif isinstance(rng, np.random.Generator):
        shares = rng.integers(0, modulus, size=shape, dtype=np.int64)
    else:
        raise ValueError(f"rng of type {type(rng).__name__} is not allowed; give a numpy.random.Generator "
                         "(seeded, in simulation) or a dpadmm.privacy.secure.Stream (in deployment)")
    return residual(shares, encoded, owner, modulus)


def residual(shares: np.ndarray, encoded: np.ndarray, owner: int, modulus: int) -> np.ndarray:
    """``shares`` [N, *shape] with row ``owner`` replaced by encoded - sum of the other rows (mod p), so that
    all N add up to ``encoded``. :func:`split` with its uniform rows drawn; public so that a test can feed
    every possible draw."""
    shares = _check(shares, modulus).copy()
    others = np.zeros_like(shares[0])
    for j in range(shares.shape[0]):
        if j != owner:
            others = _add(others, shares[j], modulus)
    shares[owner] = np.mod(_check(encoded, modulus) - others, modulus)
    return shares


def partial_sums(shares: np.ndarray, modulus: int) -> np.ndarray:
    """s_hat_j = sum_i s_ij mod p, [N, *shape], from all shares [N (from i), N (to j), *shape]: what agent j
    broadcasts (it holds column j: the share it kept and the N - 1 it received)."""
    shares = _check(shares, modulus)
    if shares.ndim < 2 or shares.shape[0] != shares.shape[1]:
        raise ValueError(f"shares of shape {shares.shape} are not allowed; give [N (from), N (to), ...]")
    total = np.zeros_like(shares[0])
    for i in range(shares.shape[0]):
        total = _add(total, shares[i], modulus)
    return total


def reconstruct(partials: np.ndarray, modulus: int) -> np.ndarray:
    """sum_j s_hat_j mod p (eq. (15)): the encoded sum of all agents' vectors, from the N broadcasts."""
    partials = _check(partials, modulus)
    total = np.zeros_like(partials[0])
    for j in range(partials.shape[0]):
        total = _add(total, partials[j], modulus)
    return total


def secure_sum(values: np.ndarray, codec: FixedPoint, rng: np.random.Generator | secure.Stream) -> np.ndarray:
    """The sum over agents of ``values`` [N, *shape] (row i agent i's vector) by the whole protocol: encode,
    split, exchange, broadcast the partial sums, reconstruct, decode. Exact in Z_p; the decoded sum is
    within N / (2 scale) of the real one (each value rounded to 1/scale)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim < 1 or values.shape[0] != codec.agents:
        raise ValueError(f"values of shape {values.shape} are not allowed; give one row per agent "
                         f"({codec.agents})")
    shares = np.stack([split(codec.encode(values[i]), i, codec.agents, codec.modulus, rng)
                       for i in range(codec.agents)])
    return codec.decode(reconstruct(partial_sums(shares, codec.modulus), codec.modulus))
