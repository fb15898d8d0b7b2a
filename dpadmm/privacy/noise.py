"""Keyed, counter-based noise streams: the same draws on every execution path.

The privacy noise of the algorithms (the Laplace vector xi of the objective
perturbation, eq. (9a) of paper 003, and the Gaussian noise of the output-perturbation
baseline) must not depend on *how* a run is executed. A Flower client draws the noise of
one agent, the batched engine draws it for all P agents at once, possibly on a GPU, and
either may visit agents, rounds and local steps in any order. A sequential generator
(``torch.Generator``) cannot give that: its output depends on how much was drawn
before, and its CPU and CUDA streams differ.

Here every variate is a pure function of its coordinates. The block function
Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1,
2, 3", SC'11; the Random123 library) maps a 128-bit counter and a 64-bit key to 128
random bits, and we use

* key     = (seed, agent),
* counter = (block index, local step, round, stream),

so the noise of (seed, agent p, round t, local step e) is reproducible from the seed
alone, and drawing agent 3 by itself gives exactly row 3 of a batched draw. Each block
gives four 32-bit words w0..w3; (w0, w1) and (w2, w3) each make one 53-bit uniform, so
element ``j`` of a draw uses block ``j // 2`` only and a shorter draw is a prefix of a
longer one.

Bit-identical on CPU and CUDA. Everything is made of elementwise torch operations whose
results IEEE 754 and two's-complement arithmetic fix exactly: integer and bitwise ops on
int64 tensors holding uint32 values (torch has no dependable uint32 arithmetic, and no
intermediate here reaches 2**63), float64 arithmetic on integers below 2**53 (exact, so
no rounding mode or fused multiply-add can change it), conversions of such integers,
and float64 +, -, *, / between tensors, comparisons and selections. The transcendental
functions the transforms need (log, sqrt, sin, cos) are deliberately *not* torch's: its
CPU kernels are not correctly rounded (``torch.sqrt`` of float64 is one unit in the last
place off for about 1% of inputs) and differ from the CUDA ones. They are
evaluated below from the basic operations (exact argument reduction plus a series),
accurate to about 2 units in the last place. No division is by a Python scalar, which
CUDA turns into a multiplication by the reciprocal.

A faster generator for large models. Philox in portable float64 arithmetic gives about
2.5 million variates per second per CPU core, so a network of millions of parameters
needs seconds per agent and step. ``generator="torch"`` keeps the keyed design but draws
each (seed, agent, round, step, stream) from its own torch CPU generator, seeded with 64
bits of Philox at that key and counter (block index 2**32 - 1, which no draw of the
``philox`` generator reaches for numel < 2**33 - 1): about 50 times faster, and still the
same numbers for an agent whatever else is drawn, in any order, by the engine or a
Flower client. It does not promise what ``philox`` does across devices and builds:
the numbers are those of torch's CPU generator and transforms, fixed for one torch build
(then moved to the device), not bit-identical to ``philox`` draws.

Speed. Three paths compute the same bits: on a CPU the fused C kernel of
:mod:`dpadmm.native` (Philox on 32-bit integers, then the transforms' float64 operations one
by one, vectorised over elements); on an accelerator one graph of the whole draw compiled by
``torch.compile`` (:func:`_compiled_draw`; its generated code is checked against the portable
path on first use); and everywhere the portable torch path below, which is the definition
the other two are tested against and the fallback where they cannot run. On an accelerator
the argument checks look at tensor values only where they are on the CPU: a value check
would make every draw wait for the device.

The portable path. The public :func:`philox4x32` is the plain int64 reference. The draws use the
same function on words stored as float64 values ``2**52 + w``: the 32x32-bit products
are split into exact float64 products below 2**49 (int64 multiplies are two to four
times slower than float64 ones on CPU), and the bit pattern of ``2**52 + w`` is ``0x433 << 52
| w``, so the XORs of the round run on the int64 view. Work proceeds in chunks that stay
in cache, with buffers reused from chunk to chunk. Tests check the fast path against
the reference and the reference against Random123's known-answer vectors.
"""

from __future__ import annotations

import functools
import logging
import math
import operator

import torch

from dpadmm import native
from dpadmm.catalog import GENERATORS  # see "A faster generator for large models" above
from dpadmm.privacy.transforms import COS_COEFFS, HALF_PI, LN2_HI, LN2_LO, LOG_COEFFS, SIN_COEFFS, SQRT_MAGIC

_log = logging.getLogger(__name__)

STREAM_OBJECTIVE: int = 0  # Laplace noise xi of the objective perturbation, eq. (9a) of paper 003
STREAM_OUTPUT: int = 1  # Gaussian noise of the output-perturbation baseline (OutP)
STREAM_PARTICIPATION: int = 2  # which agents a round samples (partial participation)
STREAM_BATCH: int = 3  # which samples a local step of a minibatched agent uses
STREAM_GRADIENT: int = 4  # Gaussian noise on the full-batch gradient of paper 002's DP-ADMM
STREAM_MESSAGE: int = 5  # Gaussian noise of a party's message in paper 001's ADMM sharing
STREAM_EXCHANGE: int = 6  # Laplace noise on the iterate an agent exchanges in paper 004
STREAM_AGGREGATOR: int = 7  # an agent's random aggregation weights w in paper 004
STREAM_START: int = 8  # an agent's random start x^0 in paper 004

__all__ = [
    "STREAM_AGGREGATOR", "STREAM_BATCH", "STREAM_EXCHANGE", "STREAM_GRADIENT", "STREAM_MESSAGE",
    "STREAM_OBJECTIVE", "STREAM_OUTPUT", "STREAM_PARTICIPATION", "STREAM_START",
    "GENERATORS", "gaussian", "laplace", "philox4x32", "uniform",
]


_U32 = 2**32
_MASK32 = 0xFFFFFFFF
# Philox-4x32 multipliers and Weyl key increments (Salmon et al. 2011, Random123).
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_ROUNDS = 10

# Elements per [rows, blocks] chunk tensor. On CPU about 1 MiB per tensor keeps the
# working set in cache while the ~350 torch calls per chunk cost little; on CUDA
# larger chunks mean fewer kernel launches.
_CHUNK = {"cpu": 2**17}
_CHUNK_OTHER = 2**21
_MAX_NUMEL = 2**33  # block indices must fit in 32 bits
_BUFFERS = 8  # chunk buffers: at most 7 are in use at once (more would be allocated if needed)

_TWO52 = 2.0**52
_B52 = 0x4330000000000000  # bit pattern of float64 2**52: bits(2**52 + w) = _B52 | w for w < 2**52
_SIGN_BIT = -(2**63)  # int64 with only the sign bit set; 0 or 1 times it never overflows

# log: t = 2**e * m with m in [sqrt(1/2), sqrt(2)), read off the bit pattern.
_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD  # bit pattern of float64 sqrt(1/2)
_MANT_MASK = 2**52 - 1
_SQRT_NEWTON_STEPS = 4  # relative error 0.061 -> 1.7e-3 -> 1.5e-6 -> 1.1e-12 -> rounding


# --------------------------------------------------------------------------- validation


def _u32(name: str, value: object) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r} must be an integer in [0, 2**32)") from None
    if not 0 <= v < _U32:
        raise ValueError(f"{name}={v} is out of range; it must lie in [0, 2**32)")
    return v


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of dtype {x.dtype} and shape {tuple(x.shape)}"
    return repr(x)


def _check_agents(agents: object) -> torch.Tensor:
    if not isinstance(agents, torch.Tensor) or agents.dtype != torch.int64 or agents.dim() != 1:
        raise TypeError(f"agents must be a 1-D int64 tensor of agent ids; got {_describe(agents)}")
    # Values are checked on the CPU only: on an accelerator the check would make every draw wait for it.
    bad = (agents < 0) | (agents > _MASK32)
    if agents.device.type == "cpu" and agents.numel() and bool(bad.any()):
        raise ValueError(
            f"agent id {agents[bad][0].item()} is out of range; agent ids must lie in [0, 2**32)"
        )
    return agents


def _check_numel(numel: object) -> int:
    try:
        if isinstance(numel, bool):
            raise TypeError
        n = operator.index(numel)
    except TypeError:
        raise TypeError(f"numel={numel!r} must be an integer >= 0") from None
    if not 0 <= n <= _MAX_NUMEL:
        raise ValueError(f"numel={n} is out of range; it must lie in [0, 2**33]")
    return n


def _check_shape(shape: object) -> tuple[int, ...]:
    try:
        dims = tuple(operator.index(d) for d in shape)  # type: ignore[union-attr]
    except TypeError:
        raise TypeError(f"shape={shape!r} must be a tuple of integers >= 0") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape={dims} has a negative dimension; dimensions must be >= 0")
    return dims


def _check_scale(name: str, scale: object, agents: torch.Tensor) -> torch.Tensor:
    if not isinstance(scale, torch.Tensor) or not scale.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor of shape [P]; got {_describe(scale)}")
    if scale.shape != agents.shape:
        raise ValueError(f"{name} has shape {tuple(scale.shape)}; it must be [P] = {tuple(agents.shape)}")
    if scale.device != agents.device:
        raise ValueError(f"{name} is on {scale.device} but agents are on {agents.device}; use one device")
    scale = scale.to(torch.float64)
    ok = torch.isfinite(scale) & (scale >= 0)
    if scale.device.type == "cpu" and scale.numel() and not bool(ok.all()):  # as for agents
        raise ValueError(f"{name} contains {scale[~ok][0].item()}; every entry must be finite and >= 0")
    return scale


def _check_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype={dtype!r} is not allowed; choose a floating-point torch dtype")
    return dtype


# ---------------------------------------------------------------- Philox: int64 reference


def _mulhilo(m: int, c):
    """(hi, lo) 32-bit words of the 64-bit product m * c, for m, c < 2**32.

    c is a Python int or an int64 tensor. m is split into 16-bit halves so every
    intermediate stays below 2**49: with x = c * m_lo and y = c * m_hi (both < 2**48),
    m * c = y * 2**16 + x, hence hi = (y + (x >> 16)) >> 16 and
    lo = ((y mod 2**16) * 2**16 + x) mod 2**32.
    """
    if not isinstance(c, torch.Tensor):
        p = m * c
        return p >> 32, p & _MASK32
    x = c * (m & 0xFFFF)
    y = c * (m >> 16)
    hi = x >> 16
    hi += y
    hi >>= 16
    y &= 0xFFFF
    x.add_(y, alpha=0x10000)
    x &= _MASK32
    return hi, x


def _xor3(a, b, c):
    """a ^ b ^ c for Python ints and broadcastable int64 tensors; a tensor `a` is ours to reuse."""
    for v in (b, c):
        if isinstance(a, torch.Tensor) and (
            not isinstance(v, torch.Tensor) or torch.broadcast_shapes(a.shape, v.shape) == a.shape
        ):
            a ^= v
        else:
            a = a ^ v
    return a


def _round_keys(k0, k1, rounds: int) -> list:
    """The key of each round: the Weyl sequence (k0 + r W0, k1 + r W1) mod 2**32."""
    return [((k0 + r * _W0) & _MASK32, (k1 + r * _W1) & _MASK32) for r in range(rounds)]


def _philox(c0, c1, c2, c3, keys: list):
    """Philox-4x32 rounds on counter words (ints or broadcastable int64 tensors)."""
    for k0, k1 in keys:
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = _xor3(hi1, c1, k0), lo1, _xor3(hi0, c3, k1), lo0
    return c0, c1, c2, c3


def philox4x32(counter: torch.Tensor, key: torch.Tensor, rounds: int = 10) -> torch.Tensor:
    """Philox-4x32-R block function (Random123) on int64 tensors holding uint32 words.

    counter: int64 [..., 4], key: int64 [..., 2] (broadcastable), every entry in [0, 2**32).
    Returns int64 [..., 4] of uint32 values in [0, 2**32).
    """
    for name, t, width in (("counter", counter, 4), ("key", key, 2)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() == 0 or t.shape[-1] != width:
            raise TypeError(f"{name} must be an int64 tensor of shape [..., {width}]; got {_describe(t)}")
        bad = (t < 0) | (t > _MASK32)
        if t.numel() and bool(bad.any()):
            raise ValueError(f"{name} contains {t[bad][0].item()}; every entry must lie in [0, 2**32)")
    if counter.device != key.device:
        raise ValueError(f"counter is on {counter.device} but key is on {key.device}; use one device")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds={rounds!r} is not allowed; use an integer >= 0 (Philox-4x32-10 uses 10)")
    batch = torch.broadcast_shapes(counter.shape[:-1], key.shape[:-1])
    k0, k1 = key.unbind(-1)
    words = _philox(*counter.unbind(-1), _round_keys(k0, k1, rounds))
    return torch.stack([w.expand(batch) for w in words], dim=-1)


# ------------------------------------------------- Philox: fast path on 2**52-offset words


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64)


def _take(pool: list, like: torch.Tensor) -> torch.Tensor:
    return pool.pop() if pool else torch.empty_like(like)


def _fmulhilo(m: int, c: torch.Tensor, pool: list) -> tuple[torch.Tensor, torch.Tensor]:
    """_mulhilo on float64 words held as 2**52 + c; returns 2**52 + hi and 2**52 + lo.

    Exact: c, x = c m_lo and y = c m_hi are integers below 2**49, and so is every
    intermediate; floor(x / 2**16) and floor((y + that) / 2**16) = hi are exact too.
    Then lo = x + (y - hi 2**16) 2**16. The buffer of c is used up (returned to pool).
    """
    x, hi = _take(pool, c), _take(pool, c)
    c -= _TWO52
    torch.mul(c, float(m & 0xFFFF), out=x)
    c *= float(m >> 16)
    torch.mul(x, 2.0**-16, out=hi)
    hi.floor_()
    hi += c
    hi *= 2.0**-16
    hi.floor_()
    c.sub_(hi, alpha=65536.0)
    x += _TWO52
    x.add_(c, alpha=65536.0)
    hi += _TWO52
    pool.append(c)
    return hi, x


def _philox_chunk(ctr: torch.Tensor, step: int, round_: int, stream: int, keys: list, pool: list):
    """Philox-4x32 of the counters (ctr, step, round_, stream) under keys[r] = (seed_r, agents_r).

    ctr: int64 [1, C] block indices; agents_r: int64 [R, 1]. Returns the four output
    words as float64 [R, C] tensors holding 2**52 + w (buffers from pool).
    """
    like = pool[0]
    (s0, a0), (s1, a1) = keys[0], keys[1]
    # Round 1: counter words 1-3 and the seed are plain integers; only c0 varies (by column).
    hi0, lo0 = _mulhilo(_M0, ctr)
    hi1, lo1 = _mulhilo(_M1, round_)
    c0, c1 = hi1 ^ step ^ s0, lo1
    hi0 ^= stream | _B52
    c2 = _take(pool, like)
    torch.bitwise_xor(hi0, a0, out=_bits(c2))
    c3 = lo0
    # Round 2: c0 and c1 are still plain integers, c3 is one row.
    hi0, lo0 = _mulhilo(_M0, c0)
    hi1, lo1 = _fmulhilo(_M1, c2, pool)
    _bits(hi1).bitwise_xor_(c1 ^ s1)
    c3 ^= hi0 | _B52
    c2 = _take(pool, like)
    torch.bitwise_xor(c3, a1, out=_bits(c2))
    c0, c1, c3 = hi1, lo1, lo0
    # Rounds 3-10 on full [R, C] words (c3 is still a plain integer in round 3).
    for s, a in keys[2:]:
        hi0, lo0 = _fmulhilo(_M0, c0, pool)
        hi1, lo1 = _fmulhilo(_M1, c2, pool)
        _bits(hi1).bitwise_xor_(_bits(c1))
        _bits(hi1).bitwise_xor_(s | _B52)
        if isinstance(c3, torch.Tensor):
            _bits(hi0).bitwise_xor_(_bits(c3))
            _bits(hi0).bitwise_xor_(a | _B52)
            pool.append(c3)
        else:
            _bits(hi0).bitwise_xor_(a ^ c3)
        pool.append(c1)
        c0, c1, c2, c3 = hi1, lo1, hi0, lo0
    return c0, c1, c2, c3


# ------------------------------------------------------- float64 functions from IEEE ops


def _unit(w_hi: torch.Tensor, w_lo: torch.Tensor, scale: float, pool: list) -> torch.Tensor:
    """max(k, 1/2) * scale 2**-21, k = ((w_hi << 32) | w_lo) >> 11 the top 53 bits of two words.

    w_hi, w_lo hold 2**52 + word. With scale = 2**-32 this is the uniform u = k 2**-53 in
    (0, 1), with k = 0 mapped to u = 2**-54. Every step is exact. Returns w_hi's buffer.
    """
    w_lo *= 2.0**-11  # 2**41 + w_lo / 2**11
    w_lo.floor_()
    w_lo -= 2.0**41
    w_hi -= _TWO52
    w_hi.add_(w_lo, alpha=2.0**-21)  # k 2**-21 < 2**32, 21 fraction bits
    w_hi *= scale
    w_hi.clamp_min_(scale * 2.0**-22)
    pool.append(w_lo)
    return w_hi


def _log(t: torch.Tensor, pool: list) -> torch.Tensor:
    """Natural log of a float64 tensor of positive normal numbers (within 2 ulp); uses up t.

    t = 2**e m with m in [sqrt(1/2), sqrt(2)) read off the bit pattern; log m = 2 atanh f,
    f = (m - 1)/(m + 1), by its series; log t = (e ln2_lo + log m) + e ln2_hi.
    """
    m, e, f, p = t, _take(pool, t), _take(pool, t), _take(pool, t)
    _bits(t).sub_(_SQRT_HALF_BITS)
    torch.bitwise_right_shift(_bits(t), 52, out=_bits(f))
    e.copy_(_bits(f))
    _bits(m).bitwise_and_(_MANT_MASK)
    _bits(m).add_(_SQRT_HALF_BITS)
    torch.sub(m, 1.0, out=f)  # exact (Sterbenz)
    m += 1.0
    f /= m
    s = torch.mul(f, f, out=m)
    torch.mul(s, LOG_COEFFS[-1], out=p)
    for coeff in reversed(LOG_COEFFS[:-1]):
        p += coeff
        p *= s
    p *= f
    f *= 2.0
    p += f
    torch.mul(e, LN2_LO, out=f)
    p += f
    e *= LN2_HI
    p += e
    pool.extend((m, e, f))
    return p


def _sqrt(x: torch.Tensor, pool: list) -> torch.Tensor:
    """Square root of a float64 tensor of positive normal numbers (within 1 ulp); uses up x.

    First guess (at most 6.1% high) by halving the exponent on the bit pattern, then Newton steps
    y <- (y + x / y) / 2, whose relative error squares each time.
    """
    y, q = _take(pool, x), _take(pool, x)
    torch.bitwise_right_shift(_bits(x), 1, out=_bits(y))
    _bits(y).add_(SQRT_MAGIC)
    for _ in range(_SQRT_NEWTON_STEPS):
        torch.div(x, y, out=q)
        q += y
        q *= 0.5
        y, q = q, y
    pool.extend((x, q))
    return y


def _sincos_2pi(u: torch.Tensor, pool: list) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin 2 pi u, cos 2 pi u) for float64 u in [0, 1] (within 2e-16); uses up u.

    Exact reduction 4u = q + r, q = round(4u), |r| <= 1/2; x = r pi/2 in [-pi/4, pi/4];
    Taylor series for sin x and cos x; the quadrant q mod 4 swaps and negates them.
    """
    q, z, s, c = _take(pool, u), _take(pool, u), _take(pool, u), _take(pool, u)
    u *= 4.0
    torch.round(u, out=q)
    x = u
    x -= q
    x *= HALF_PI
    torch.mul(x, x, out=z)
    torch.mul(z, SIN_COEFFS[-1], out=s)
    for coeff in reversed(SIN_COEFFS[:-1]):
        s += coeff
        s *= z
    s *= x
    s += x
    torch.mul(z, COS_COEFFS[-1], out=c)
    for coeff in reversed(COS_COEFFS[:-1]):
        c += coeff
        c *= z
    c += 1.0
    q += _TWO52  # low bits of the pattern = quadrant q in 0..4
    quad = _bits(q)
    quad &= 3
    odd = torch.eq(quad & 1, 1)
    sin_t = torch.where(odd, c, s, out=x)
    cos_t = torch.where(odd, s, c, out=z)
    # sin 2 pi u < 0 in quadrants 2 and 3, cos 2 pi u < 0 in quadrants 1 and 2: flip the sign bit.
    _bits(sin_t).bitwise_xor_((quad >> 1) * _SIGN_BIT)
    quad += 1
    quad >>= 1
    quad &= 1
    quad *= _SIGN_BIT
    _bits(cos_t).bitwise_xor_(quad)
    pool.extend((q, s, c))
    return sin_t, cos_t


# ------------------------------------------------------------------------------ draws


def _uniform_transform(w, _param, vals: torch.Tensor, pool: list) -> None:
    for j, (hi, lo) in enumerate(((w[0], w[1]), (w[2], w[3]))):
        u = _unit(hi, lo, 2.0**-32, pool)
        vals[j].copy_(u)
        pool.append(u)


def _laplace_transform(w, scale: torch.Tensor, vals: torch.Tensor, pool: list) -> None:
    # Inverse CDF: x = b log(2u) for u < 1/2 and x = -b log(2 - 2u) for u >= 1/2. From
    # t = 2u (exact), log takes min(t, 2 - t) (2 - t is exact for t >= 1) and the result
    # gets the sign of t - 1.
    b = scale.view(-1, 1)
    for j, (hi, lo) in enumerate(((w[0], w[1]), (w[2], w[3]))):
        t = _unit(hi, lo, 2.0**-31, pool)
        sign, r = _take(pool, t), _take(pool, t)
        torch.sub(t, 1.0, out=sign)
        torch.neg(t, out=r)
        r += 2.0
        torch.minimum(t, r, out=t)
        pool.append(r)
        x = _log(t, pool)
        x *= b
        torch.copysign(x, sign, out=vals[j])
        pool.extend((x, sign))


def _gaussian_transform(w, std: torch.Tensor, vals: torch.Tensor, pool: list) -> None:
    # Box-Muller on (u1, u2) from (w0, w1) and (w2, w3):
    # r = sqrt(-2 log u1), elements (r cos 2 pi u2, r sin 2 pi u2).
    r = _log(_unit(w[0], w[1], 2.0**-32, pool), pool)
    r *= -2.0
    r = _sqrt(r, pool)
    r *= std.view(-1, 1)
    sin_t, cos_t = _sincos_2pi(_unit(w[2], w[3], 2.0**-32, pool), pool)
    torch.mul(r, cos_t, out=vals[0])
    torch.mul(r, sin_t, out=vals[1])
    pool.extend((r, sin_t, cos_t))


_NATIVE_KINDS = {"_uniform_transform": "uniform", "_laplace_transform": "laplace",
                 "_gaussian_transform": "gaussian"}
_COMPILED_CHUNK = 2**22  # blocks per call of the compiled kernel (its output: 2 float64 values per block)
_compiled_ok: dict[tuple[str, str], bool] = {}  # (device type, transform) -> passed its first-use check


def _draw(seed, agents, round_, step, stream, numel, dtype, transform, param) -> torch.Tensor:
    """[P, numel] values of the keyed stream under transform, the same bits on every path: the fused C
    kernel on a CPU (:func:`dpadmm.native.draw`), the compiled kernel on a GPU (:func:`_compiled_draw`),
    else the portable torch path chunk by chunk."""
    fused = native.draw(_NATIVE_KINDS[transform.__name__], seed, agents, round_, step, stream, numel, param,
                        dtype)
    if fused is None and agents.device.type != "cpu" and _compiled_works(agents.device, transform):
        fused = _compiled_draw(seed, agents, round_, step, stream, numel, dtype, transform, param)
    if fused is not None:
        return fused
    return _portable_draw(seed, agents, round_, step, stream, numel, dtype, transform, param)


def _portable_draw(seed, agents, round_, step, stream, numel, dtype, transform, param) -> torch.Tensor:
    """[P, numel] values of the keyed stream under transform, chunk by chunk in torch (any device)."""
    num_agents, device = agents.shape[0], agents.device
    out = torch.empty((num_agents, numel), dtype=dtype, device=device)
    if num_agents == 0 or numel == 0:
        return out
    chunk = _CHUNK.get(device.type, _CHUNK_OTHER)
    blocks = (numel + 1) // 2
    rows = min(num_agents, chunk)
    cols = max(1, min(blocks, chunk // rows))
    all_keys = _round_keys(seed, agents.view(-1, 1), _ROUNDS)
    flats = [torch.empty(rows * cols, dtype=torch.float64, device=device) for _ in range(_BUFFERS)]
    vals_flat = torch.empty(rows * cols * 2, dtype=torch.float64, device=device)
    for r0 in range(0, num_agents, rows):
        r1 = min(r0 + rows, num_agents)
        keys = all_keys if rows == num_agents else [(k0, k1[r0:r1]) for k0, k1 in all_keys]
        chunk_param = None if param is None else param[r0:r1]
        for b0 in range(0, blocks, cols):
            b1 = min(b0 + cols, blocks)
            n_r, n_c = r1 - r0, b1 - b0
            pool = [f[: n_r * n_c].view(n_r, n_c) for f in flats]
            vals = vals_flat[: n_r * n_c * 2].view(2, n_r, n_c)  # elements 2j and 2j + 1 of block j
            ctr = torch.arange(b0, b1, dtype=torch.int64, device=device).view(1, -1)
            words = _philox_chunk(ctr, step, round_, stream, keys, pool)
            transform(words, chunk_param, vals, pool)
            e0, e1 = 2 * b0, min(2 * b1, numel)
            out[r0:r1, e0:e1].copy_(vals.permute(1, 2, 0).reshape(n_r, 2 * n_c)[:, : e1 - e0])
    return out


def _block_values(blocks: torch.Tensor, agents: torch.Tensor, counters: torch.Tensor, param, transform):
    """[2, P, C] values of the blocks under transform: Philox in the int64 reference arithmetic, then the
    transform's float64 operations. Only elementwise operations, so a compiler fuses it into one kernel;
    the counters (seed, step, round, stream) are a tensor, so new rounds and steps reuse that kernel."""
    seed, step, round_, stream = counters.unbind()
    words = _philox(blocks.view(1, -1), step, round_, stream, _round_keys(seed, agents.view(-1, 1), _ROUNDS))
    floats = [w.expand(agents.shape[0], blocks.shape[0]).to(torch.float64) + _TWO52 for w in words]
    vals = torch.empty((2, agents.shape[0], blocks.shape[0]), dtype=torch.float64, device=blocks.device)
    transform(floats, param, vals, [])
    return vals


@functools.cache
def _compiled_block_values():
    # emulate_precision_casts: no fused multiply-adds in the generated GPU code, so that the transforms'
    # float64 operations round as they do in the portable path
    return torch.compile(_block_values, dynamic=True, fullgraph=True,
                         options={"emulate_precision_casts": True})


def _compiled_draw(seed, agents, round_, step, stream, numel, dtype, transform, param) -> torch.Tensor:
    """[P, numel] draws by the compiled :func:`_block_values`, a few kernels per draw (any device)."""
    device = agents.device
    counters = torch.tensor([seed, step, round_, stream], dtype=torch.int64, device=device)
    out = torch.empty((agents.shape[0], numel), dtype=dtype, device=device)
    blocks = (numel + 1) // 2
    rows = max(1, min(agents.shape[0], _COMPILED_CHUNK // max(1, blocks)))
    cols = max(1, min(blocks, _COMPILED_CHUNK))
    for r0 in range(0, agents.shape[0], rows):
        # Sizes 0 and 1 are compiled apart: a single row or block is computed as two and cut.
        chunk_agents = _at_least_two(agents[r0:r0 + rows])
        chunk_param = None if param is None else _at_least_two(param[r0:r0 + rows])
        n_r = min(rows, agents.shape[0] - r0)
        for b0 in range(0, blocks, cols):
            b1 = min(b0 + cols, blocks)
            vals = _compiled_block_values()(torch.arange(b0, max(b1, b0 + 2), device=device), chunk_agents,
                                            counters, chunk_param, transform)
            e1 = min(2 * b1, numel)
            out[r0:r0 + n_r, 2 * b0:e1] = vals[:, :n_r].permute(1, 2, 0).reshape(n_r, -1)[:, : e1 - 2 * b0]
    return out


def _at_least_two(rows: torch.Tensor) -> torch.Tensor:
    """A new tensor of the rows, twice over if there is one (a view would add guards on its base)."""
    return rows.repeat(2) if rows.shape[0] == 1 else rows.clone()


def _compiled_works(device: torch.device, transform) -> bool:
    """Whether the compiled kernel runs on this device and gives the portable path's bits, checked once
    per device type and transform on a small draw at extreme counters; if not, a note is logged and the
    portable path is used."""
    key = (device.type, transform.__name__)
    if key not in _compiled_ok:
        agents = torch.tensor([0, 7, _MASK32], device=device)
        param = torch.tensor([1.0, 0.25, 3.0], dtype=torch.float64, device=device)
        args = (_MASK32, agents, 12345, _MASK32, 3, 2049, torch.float64, transform, param)
        try:
            _compiled_ok[key] = torch.equal(_compiled_draw(*args), _portable_draw(*args))
            reason = "its draws differ from the portable path's"
        except Exception as error:  # noqa: BLE001 - any failure of the compiler stack means: do not use it
            _compiled_ok[key] = False
            reason = f"{type(error).__name__}: {error}"
        if not _compiled_ok[key]:
            _log.warning("dpadmm.privacy.noise: the compiled %s kernel is not used on %s (%s); the portable "
                         "path gives the same numbers, with more kernel launches", key[1], device.type,
                         reason[:500])
    return _compiled_ok[key]


def uniform(seed: int, agents: torch.Tensor, round_: int, step: int, stream: int, numel: int) -> torch.Tensor:
    """float64 [P, numel] uniforms in the open interval (0, 1), 53 random bits each.

    Key = (seed, agent), counter = (block j, step, round_, stream). Elements 2j and 2j+1
    come from the words (w0, w1) and (w2, w3) of block j: u = k 2**-53 with k the top 53
    bits of (w_hi << 32) | w_lo; the single value k = 0 becomes 2**-54, so u > 0.
    The output is on the device of agents.
    """
    seed, round_, step, stream = (
        _u32(n, v) for n, v in (("seed", seed), ("round_", round_), ("step", step), ("stream", stream))
    )
    agents = _check_agents(agents)
    numel = _check_numel(numel)
    return _draw(seed, agents, round_, step, stream, numel, torch.float64, _uniform_transform, None)


def laplace(
    seed: int,
    agents: torch.Tensor,
    round_: int,
    step: int,
    shape: tuple[int, ...],
    scale: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float64,
    stream: int = STREAM_OBJECTIVE,
    generator: str = "philox",
) -> torch.Tensor:
    """[P, *shape] Laplace(0, scale_p) draws from ``stream`` (STREAM_OBJECTIVE); scale: [P], >= 0.

    Inverse CDF of u = uniform(seed, agents, round_, step, STREAM_OBJECTIVE, prod(shape)):
    b log(2u) for u < 1/2 and -b log(2 - 2u) otherwise, in float64, then cast to dtype.
    Scale 0 gives zeros.
    """
    return _shaped(seed, agents, round_, step, shape, ("scale", scale), dtype, stream, _laplace_transform,
                   generator)


def gaussian(
    seed: int,
    agents: torch.Tensor,
    round_: int,
    step: int,
    shape: tuple[int, ...],
    std: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float64,
    stream: int = STREAM_OUTPUT,
    generator: str = "philox",
) -> torch.Tensor:
    """[P, *shape] N(0, std_p**2) draws from ``stream`` (STREAM_OUTPUT: OutP's; the Gaussian objective
    perturbation uses STREAM_OBJECTIVE); std: [P], >= 0.

    Box-Muller on the pairs (u_2j, u_2j+1) of uniform(seed, agents, round_, step,
    STREAM_OUTPUT, ...): elements 2j and 2j+1 are r cos(2 pi u_2j+1) and r sin(2 pi u_2j+1)
    with r = std sqrt(-2 log u_2j), in float64, then cast to dtype.
    """
    return _shaped(seed, agents, round_, step, shape, ("std", std), dtype, stream, _gaussian_transform,
                   generator)


def _shaped(seed, agents, round_, step, shape, named_param, dtype, stream, transform,
            generator) -> torch.Tensor:
    """Validate the arguments of a [P, *shape] draw, then draw it (shared by laplace and gaussian)."""
    seed, round_, step, stream = (_u32(n, v) for n, v in (("seed", seed), ("round_", round_), ("step", step),
                                                         ("stream", stream)))
    agents = _check_agents(agents)
    shape = _check_shape(shape)
    param = _check_scale(named_param[0], named_param[1], agents)
    dtype = _check_dtype(dtype)
    numel = _check_numel(math.prod(shape))
    if generator == "torch":
        out = _torch_draw(seed, agents, round_, step, stream, numel, dtype, transform is _laplace_transform,
                          param)
    elif generator == "philox":
        out = _draw(seed, agents, round_, step, stream, numel, dtype, transform, param)
    else:
        raise ValueError(f"generator={generator!r} is not allowed; choose one of {', '.join(GENERATORS)}")
    return out.view(agents.shape[0], *shape)


def _torch_draw(seed: int, agents: torch.Tensor, round_: int, step: int, stream: int, numel: int,
                dtype: torch.dtype, laplace: bool, param: torch.Tensor) -> torch.Tensor:
    """[P, numel] Laplace (inverse CDF) or Gaussian draws, each agent from a torch CPU generator whose
    64-bit seed is the Philox block (2**32 - 1, step, round_, stream) under key (seed, agent)."""
    counter = torch.tensor([_MASK32, step, round_, stream], dtype=torch.int64)
    keys = torch.stack([torch.full_like(agents.cpu(), seed), agents.cpu()], dim=1)
    words = philox4x32(counter.expand(agents.shape[0], 4), keys)
    out = torch.empty((agents.shape[0], numel), dtype=dtype, device=agents.device)
    for i, (hi, lo) in enumerate(words[:, :2].tolist()):
        rng = torch.Generator(device="cpu")
        rng.manual_seed((hi << 32) | lo)
        if laplace:
            # u - 1/2 in (-1/2, 1/2): torch.rand gives k 2**-53, k < 2**53; the shift keeps log1p finite.
            v = torch.rand(numel, generator=rng, dtype=torch.float64).sub_(0.5 - 2.0**-54)
            x = v.abs().mul_(-2.0).log1p_().mul_(v.sign()).mul_(-float(param[i]))
        else:
            x = torch.randn(numel, generator=rng, dtype=torch.float64).mul_(float(param[i]))
        out[i].copy_(x)
    return out
