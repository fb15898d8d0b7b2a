"""Tests of dpadmm.privacy.noise: Philox known answers, keying, batching invariance, distributions.

Every test runs twice: with the fused C kernel (dpadmm.native) and with the portable torch path that is
its definition and the fallback (and the only path on CUDA).
"""

from __future__ import annotations

import decimal
import math

import numpy as np
import pytest
import scipy.stats
import torch

from dpadmm import native
from dpadmm.privacy import noise, transforms

F64 = torch.float64


@pytest.fixture(autouse=True, params=["fused", "portable"])
def draw_path(request, monkeypatch) -> str:
    if request.param == "fused":
        assert native.library() is not None, "the C kernels did not build"
    else:
        monkeypatch.setattr(native, "library", lambda: None)
    return request.param

# Random123 kat_vectors, philox4x32 with 10 rounds: counter, key -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def _ones(p: int) -> torch.Tensor:
    return torch.ones(p, dtype=F64)


def _reference_uniform(seed: int, agents: torch.Tensor, round_: int, step: int, stream: int, numel: int):
    """The documented stream, spelled out with the int64 reference philox4x32."""
    blocks = (numel + 1) // 2
    counter = torch.stack(
        [
            torch.arange(blocks),
            torch.full((blocks,), step),
            torch.full((blocks,), round_),
            torch.full((blocks,), stream),
        ],
        dim=-1,
    )
    key = torch.stack([torch.full_like(agents, seed), agents], dim=-1)
    w = noise.philox4x32(counter.unsqueeze(0), key.unsqueeze(1))  # [P, blocks, 4]
    k = torch.stack([(w[..., 0] << 21) | (w[..., 1] >> 11), (w[..., 2] << 21) | (w[..., 3] >> 11)], dim=-1)
    u = k.reshape(len(agents), -1)[:, :numel].to(F64) * 2.0**-53
    return u.clamp_min(2.0**-54)


# ------------------------------------------------------------------------------ Philox


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_philox_known_answers(counter, key, expected):
    out = noise.philox4x32(torch.tensor(counter), torch.tensor(key))
    assert out.dtype == torch.int64
    assert out.tolist() == list(expected)


def test_philox_batched_and_broadcast():
    counters = torch.tensor([c for c, _, _ in KAT])
    keys = torch.tensor([k for _, k, _ in KAT])
    assert noise.philox4x32(counters, keys).tolist() == [list(e) for _, _, e in KAT]
    # One key for many counters, and one counter for many keys.
    out = noise.philox4x32(counters, keys[2])
    assert out.shape == (3, 4) and out[2].tolist() == list(KAT[2][2])
    out = noise.philox4x32(counters[:, None, :], keys[None, :, :])
    assert out.shape == (3, 3, 4)
    for i in range(3):
        assert out[i, i].tolist() == list(KAT[i][2])
    assert ((out >= 0) & (out < 2**32)).all()


def test_philox_rounds_and_validation():
    c, k = torch.tensor(KAT[2][0]), torch.tensor(KAT[2][1])
    assert torch.equal(noise.philox4x32(c, k, rounds=0), c)
    assert not torch.equal(noise.philox4x32(c, k, rounds=7), noise.philox4x32(c, k))
    with pytest.raises(ValueError, match="2\\*\\*32"):
        noise.philox4x32(torch.tensor([0, 0, 0, 2**32]), k)
    with pytest.raises(ValueError, match="-1"):
        noise.philox4x32(c, torch.tensor([0, -1]))
    with pytest.raises(TypeError, match=r"\[\.\.\., 4\]"):
        noise.philox4x32(torch.tensor([0, 0, 0]), k)
    with pytest.raises(TypeError, match="int64"):
        noise.philox4x32(c.to(torch.int32), k)
    with pytest.raises(ValueError, match="rounds"):
        noise.philox4x32(c, k, rounds=-1)


def test_fast_path_matches_reference():
    agents = torch.tensor([0, 5, 2**32 - 1, 77])
    for seed, round_, step, stream, numel in [(0, 0, 0, 0, 8), (2**32 - 1, 2**32 - 1, 123456, 1, 9)]:
        got = noise.uniform(seed, agents, round_, step, stream, numel)
        assert torch.equal(got, _reference_uniform(seed, agents, round_, step, stream, numel))


def test_pinned_values():
    # The stream is part of the reproducibility contract: these must never change.
    u = noise.uniform(1, torch.tensor([0, 1]), 0, 0, noise.STREAM_OBJECTIVE, 3)
    expected = _reference_uniform(1, torch.tensor([0, 1]), 0, 0, noise.STREAM_OBJECTIVE, 3)
    assert torch.equal(u, expected)
    assert [float.hex(v) for v in u[0].tolist()] == PINNED_ROW0


PINNED_ROW0 = ["0x1.c7d00ce1ca141p-1", "0x1.2be445816c2b5p-1", "0x1.58102837bf8b9p-1"]


# ---------------------------------------------------------------------- keying, batching


def _draw_all(seed, agents, round_, step, numel=37):
    p = len(agents)
    return (
        noise.uniform(seed, agents, round_, step, noise.STREAM_OBJECTIVE, numel),
        noise.laplace(seed, agents, round_, step, (numel,), _ones(p)),
        noise.gaussian(seed, agents, round_, step, (numel,), _ones(p)),
    )


def test_deterministic():
    agents = torch.arange(4)
    for a, b in zip(_draw_all(11, agents, 2, 3), _draw_all(11, agents, 2, 3), strict=True):
        assert torch.equal(a, b)


def test_batching_and_order_invariance():
    full = _draw_all(5, torch.arange(6), 7, 1)
    alone = _draw_all(5, torch.tensor([3]), 7, 1)
    shuffled = _draw_all(5, torch.tensor([5, 3, 1]), 7, 1)
    for f, a, s in zip(full, alone, shuffled, strict=True):
        assert torch.equal(a[0], f[3])
        assert torch.equal(s, f[[5, 3, 1]])


def test_chunking_invariance(monkeypatch):
    agents = torch.arange(9)
    whole = _draw_all(3, agents, 1, 2, numel=301)
    monkeypatch.setitem(noise._CHUNK, "cpu", 64)  # 9 rows x 7 blocks per chunk, the last one partial
    for w, s in zip(whole, _draw_all(3, agents, 1, 2, numel=301), strict=True):
        assert torch.equal(w, s)
    monkeypatch.setitem(noise._CHUNK, "cpu", 4)  # 4 rows x 1 block per chunk, row chunks too
    for w, s in zip(whole, _draw_all(3, agents, 1, 2, numel=31), strict=True):
        assert torch.equal(w[:, :31], s)


def test_prefix_property():
    agents = torch.arange(3)
    for short, long in zip(
        _draw_all(9, agents, 4, 4, numel=15), _draw_all(9, agents, 4, 4, numel=40), strict=True
    ):
        assert torch.equal(short, long[:, :15])


def test_every_coordinate_changes_the_draw():
    agents = torch.tensor([2])
    base = noise.uniform(1, agents, 1, 1, 0, 64)
    for kwargs in [
        dict(seed=2, agents=agents, round_=1, step=1, stream=0),
        dict(seed=1, agents=torch.tensor([3]), round_=1, step=1, stream=0),
        dict(seed=1, agents=agents, round_=2, step=1, stream=0),
        dict(seed=1, agents=agents, round_=1, step=2, stream=0),
        dict(seed=1, agents=agents, round_=1, step=1, stream=1),
    ]:
        other = noise.uniform(numel=64, **kwargs)
        assert not torch.isin(other, base).any()
    # Round and step are not interchangeable, nor are seed and agent.
    assert not torch.equal(noise.uniform(1, agents, 1, 2, 0, 8), noise.uniform(1, agents, 2, 1, 0, 8))
    assert not torch.equal(
        noise.uniform(2, torch.tensor([1]), 0, 0, 0, 8), noise.uniform(1, agents, 0, 0, 0, 8)
    )
    # Laplace and Gaussian noise use different streams.
    u_obj = noise.uniform(1, agents, 1, 1, noise.STREAM_OBJECTIVE, 64)
    x = noise.laplace(1, agents, 1, 1, (64,), _ones(1))
    g = noise.gaussian(1, agents, 1, 1, (64,), _ones(1))
    assert torch.equal(torch.sign(x), torch.sign(u_obj - 0.5))
    assert not torch.equal(torch.sign(g), torch.sign(x))


# ------------------------------------------------------------------------ distributions


def test_uniform_open_interval_and_edges():
    u = noise.uniform(0, torch.arange(8), 0, 0, 0, 20001)
    assert u.dtype == F64 and u.shape == (8, 20001)
    assert (u > 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.005
    # Every value is a multiple of 2**-53 (53 random bits).
    assert torch.equal(torch.floor(u * 2.0**53), u * 2.0**53)
    # The extreme words: k = 0 maps to 2**-54, k = 2**53 - 1 to 1 - 2**-53.
    lo = torch.tensor([0.0, 0.0, 2.0**32 - 1], dtype=F64) + 2.0**52
    hi = torch.tensor([0.0, 2.0**32 - 1, 2.0**32 - 1], dtype=F64) + 2.0**52
    got = noise._unit(hi, lo, 2.0**-32, [])
    assert got.tolist() == [2.0**-54, 1 - 2.0**-32, 1 - 2.0**-53]


def test_laplace_distribution():
    b = 0.7
    x = noise.laplace(2024, torch.arange(4), 3, 0, (50000,), torch.full((4,), b, dtype=F64)).flatten()
    assert abs(x.abs().mean().item() / b - 1) < 0.01
    assert abs(x.mean().item()) < 0.01
    assert scipy.stats.kstest(x.numpy(), scipy.stats.laplace(scale=b).cdf).pvalue > 1e-3


def test_gaussian_distribution():
    s = 1.3
    g = noise.gaussian(2024, torch.arange(4), 3, 0, (50000,), torch.full((4,), s, dtype=F64)).flatten()
    assert abs(g.std().item() / s - 1) < 0.01
    assert abs(g.mean().item()) < 0.015
    assert scipy.stats.kstest(g.numpy(), scipy.stats.norm(scale=s).cdf).pvalue > 1e-3
    # Both Box-Muller outputs are used and independent: even and odd elements alike.
    g = g.view(4, -1)
    for part in (g[:, 0::2], g[:, 1::2]):
        assert scipy.stats.kstest(part.flatten().numpy(), scipy.stats.norm(scale=s).cdf).pvalue > 1e-3
    assert abs(np.corrcoef(g[:, 0::2].flatten(), g[:, 1::2].flatten())[0, 1]) < 0.02


def test_laplace_is_inverse_cdf_of_the_uniform():
    agents = torch.arange(3)
    scale = torch.tensor([1.0, 2.5, 0.1], dtype=F64)
    x = noise.laplace(8, agents, 1, 2, (7, 11), scale)
    assert x.shape == (3, 7, 11) and x.dtype == F64
    u = noise.uniform(8, agents, 1, 2, noise.STREAM_OBJECTIVE, 77)
    b = scale[:, None]
    ref = torch.where(u < 0.5, b * torch.log(2 * u), -b * torch.log(2 - 2 * u))
    torch.testing.assert_close(x.view(3, -1), ref, rtol=1e-15, atol=0)


def test_gaussian_is_box_muller_of_the_uniform():
    agents = torch.arange(3)
    std = torch.tensor([1.0, 2.5, 0.1], dtype=F64)
    g = noise.gaussian(8, agents, 1, 2, (5, 3), std)
    assert g.shape == (3, 5, 3)
    u = noise.uniform(8, agents, 1, 2, noise.STREAM_OUTPUT, 16)
    r = torch.sqrt(-2 * torch.log(u[:, 0::2])) * std[:, None]
    theta = 2 * math.pi * u[:, 1::2]
    ref = torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=-1).reshape(3, -1)[:, :15]
    torch.testing.assert_close(g.view(3, -1), ref, rtol=1e-14, atol=1e-14)


def test_per_agent_scales_and_zero():
    agents = torch.tensor([4, 0, 9])
    scale = torch.tensor([2.0, 0.0, 0.25], dtype=F64)
    unit_x = noise.laplace(1, agents, 0, 0, (1000,), _ones(3))
    x = noise.laplace(1, agents, 0, 0, (1000,), scale)
    assert torch.equal(x, unit_x * scale[:, None])  # exact: x = log(.) * b
    assert (x[1] == 0).all()
    unit_g = noise.gaussian(1, agents, 0, 0, (1000,), _ones(3))
    g = noise.gaussian(1, agents, 0, 0, (1000,), scale)
    torch.testing.assert_close(g, unit_g * scale[:, None], rtol=1e-15, atol=0)
    assert (g[1] == 0).all()
    # A float32 scale is accepted and used in float64.
    assert torch.equal(noise.laplace(1, agents, 0, 0, (1000,), scale.float()), x)


def test_float32_output_is_cast_of_float64():
    agents = torch.arange(3)
    scale = torch.tensor([1.0, 1e-3, 7.0], dtype=F64)
    for fn in (noise.laplace, noise.gaussian):
        x64 = fn(4, agents, 2, 1, (33,), scale)
        x32 = fn(4, agents, 2, 1, (33,), scale, dtype=torch.float32)
        assert x32.dtype == torch.float32 and torch.equal(x32, x64.float())


def test_empty_draws():
    assert noise.uniform(0, torch.arange(3), 0, 0, 0, 0).shape == (3, 0)
    assert noise.laplace(0, torch.arange(0), 0, 0, (4, 5), torch.ones(0, dtype=F64)).shape == (0, 4, 5)
    assert noise.gaussian(0, torch.arange(2), 0, 0, (4, 0), _ones(2)).shape == (2, 4, 0)
    assert noise.laplace(0, torch.arange(2), 0, 0, (), _ones(2)).shape == (2,)


# ------------------------------------------------------------- float64 building blocks


def _max_ulp(got: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.numpy() - ref) / np.spacing(np.abs(ref))))


def test_log_sqrt_sincos_accuracy():
    gen = torch.Generator().manual_seed(0)
    t = torch.cat(
        [
            torch.randint(1, 2**53, (20000,), generator=gen).to(F64) * 2.0**-53,
            torch.tensor(
                [2.0**-54, 2.0**-53, 0.5, 1 - 2.0**-53, 2**-0.5, 2**0.5, 3.0, 1e-300, 1e300], dtype=F64
            ),
        ]
    )
    ref = np.array([math.log(v) for v in t.tolist()])
    assert _max_ulp(noise._log(t.clone(), []), ref) <= 2
    assert noise._log(torch.ones(1, dtype=F64), []).item() == 0.0
    x = torch.cat(
        [
            torch.rand(20000, generator=gen, dtype=F64) * 80,
            torch.tensor([2.0**-52, 1.0, 2.0, 1e300], dtype=F64),
        ]
    )
    assert _max_ulp(noise._sqrt(x.clone(), []), np.sqrt(x.numpy())) <= 1
    u = torch.cat([torch.rand(20000, generator=gen, dtype=F64), torch.arange(9, dtype=F64) / 8])
    sin_t, cos_t = noise._sincos_2pi(u.clone(), [])
    theta = 2 * np.pi * u.numpy().astype(np.longdouble)
    assert np.max(np.abs(sin_t.numpy() - np.sin(theta))) < 4e-16
    assert np.max(np.abs(cos_t.numpy() - np.cos(theta))) < 4e-16


def test_ln2_split():
    mantissa = int(math.frexp(transforms.LN2_HI)[0] * 2**53)
    assert (mantissa & -mantissa).bit_length() - 1 >= 11  # e * LN2_HI exact for |e| < 2**11
    assert math.log(2) == transforms.LN2_HI + transforms.LN2_LO
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        hi, lo = decimal.Decimal(transforms.LN2_HI), decimal.Decimal(transforms.LN2_LO)
        error = hi + lo - decimal.Decimal(2).ln()
        assert abs(error) < decimal.Decimal(2) ** -100


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(seed=-1), ValueError, "seed=-1"),
        (dict(seed=2**32), ValueError, "seed=4294967296"),
        (dict(seed=1.5), TypeError, "seed=1.5"),
        (dict(seed=True), TypeError, "seed=True"),
        (dict(round_=2**32), ValueError, "round_"),
        (dict(step=-3), ValueError, "step=-3"),
        (dict(stream=2**40), ValueError, "stream"),
        (dict(numel=-1), ValueError, "numel=-1"),
        (dict(agents=torch.arange(3, dtype=torch.int32)), TypeError, "int64"),
        (dict(agents=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "1-D"),
        (dict(agents=[0, 1]), TypeError, "agents"),
        (dict(agents=torch.tensor([0, -2])), ValueError, "agent id -2"),
        (dict(agents=torch.tensor([2**32])), ValueError, "agent id 4294967296"),
    ],
)
def test_uniform_validation(kwargs, error, match):
    args = dict(seed=0, agents=torch.arange(2), round_=0, step=0, stream=0, numel=4) | kwargs
    with pytest.raises(error, match=match):
        noise.uniform(**args)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(scale=torch.ones(3, dtype=F64)), ValueError, r"shape \(3,\)"),
        (dict(scale=torch.tensor([1.0, -1.0], dtype=F64)), ValueError, "-1.0"),
        (dict(scale=torch.tensor([1.0, float("nan")], dtype=F64)), ValueError, "nan"),
        (dict(scale=torch.tensor([1.0, float("inf")], dtype=F64)), ValueError, "inf"),
        (dict(scale=torch.ones(2, dtype=torch.int64)), TypeError, "floating-point"),
        (dict(scale=1.0), TypeError, "floating-point"),
        (dict(shape=(3, -1)), ValueError, "negative"),
        (dict(shape=5), TypeError, "shape=5"),
        (dict(dtype=torch.int32), TypeError, "dtype"),
        (dict(seed=-1), ValueError, "seed=-1"),
    ],
)
def test_laplace_gaussian_validation(kwargs, error, match):
    for fn, name in ((noise.laplace, "scale"), (noise.gaussian, "std")):
        args = dict(seed=0, agents=torch.arange(2), round_=0, step=0, shape=(3,), scale=_ones(2)) | kwargs
        args[name] = args.pop("scale")
        with pytest.raises(error, match=match.replace("scale", name)):
            fn(**args)


# ------------------------------------------------------------------- the torch generator


@pytest.mark.parametrize("fn", [noise.laplace, noise.gaussian])
def test_torch_generator_is_keyed(fn):
    """Each (seed, agent, round, step, stream) has its own stream: an agent's draw does not depend on
    which other agents are drawn with it, and any coordinate change gives other numbers."""
    agents = torch.tensor([4, 9, 2**32 - 1])
    scale = torch.tensor([1.0, 2.0, 0.5], dtype=F64)
    full = fn(7, agents, 3, 2, (50, 4), scale, generator="torch")
    assert torch.equal(full, fn(7, agents, 3, 2, (50, 4), scale, generator="torch"))
    assert torch.equal(full[1:2], fn(7, agents[1:2], 3, 2, (50, 4), scale[1:2], generator="torch"))
    for changed in ((8, agents, 3, 2), (7, agents - 1, 3, 2), (7, agents, 4, 2), (7, agents, 3, 1)):
        assert not torch.equal(full, fn(*changed, (50, 4), scale, generator="torch"))
    other_stream = fn(7, agents, 3, 2, (50, 4), scale, generator="torch", stream=noise.STREAM_BATCH)
    assert not torch.equal(full, other_stream)
    assert not torch.equal(full, fn(7, agents, 3, 2, (50, 4), scale))  # not the philox numbers


def test_torch_generator_distributions():
    b = 0.7
    x = noise.laplace(2024, torch.arange(2), 3, 1, (50000,), torch.full((2,), b, dtype=F64),
                      generator="torch").flatten()
    assert scipy.stats.kstest(x.numpy(), scipy.stats.laplace(scale=b).cdf).pvalue > 1e-3
    g = noise.gaussian(2024, torch.arange(2), 3, 1, (50000,), torch.full((2,), b, dtype=F64),
                       generator="torch").flatten()
    assert scipy.stats.kstest(g.numpy(), scipy.stats.norm(scale=b).cdf).pvalue > 1e-3
    assert torch.isfinite(x).all() and torch.isfinite(g).all()


def test_unknown_generator_is_named():
    with pytest.raises(ValueError, match="generator='mt' is not allowed; choose one of philox, torch"):
        noise.laplace(0, torch.arange(1), 1, 1, (3,), _ones(1), generator="mt")


# ------------------------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cpu_and_cuda_bit_identical():
    agents = torch.tensor([0, 3, 17, 2**32 - 1])
    scale = torch.tensor([1.0, 0.5, 0.0, 3.0], dtype=F64)
    shape = (301, 7)
    cpu = [
        noise.uniform(42, agents, 5, 6, noise.STREAM_OUTPUT, 2107),
        noise.laplace(42, agents, 5, 6, shape, scale),
        noise.gaussian(42, agents, 5, 6, shape, scale),
        noise.laplace(42, agents, 5, 6, shape, scale, dtype=torch.float32),
    ]
    a, s = agents.cuda(), scale.cuda()
    gpu = [
        noise.uniform(42, a, 5, 6, noise.STREAM_OUTPUT, 2107),
        noise.laplace(42, a, 5, 6, shape, s),
        noise.gaussian(42, a, 5, 6, shape, s),
        noise.laplace(42, a, 5, 6, shape, s, dtype=torch.float32),
    ]
    for c, g in zip(cpu, gpu, strict=True):
        assert g.device.type == "cuda"
        assert torch.equal(c, g.cpu())
    c, k = torch.tensor([list(c) for c, _, _ in KAT]), torch.tensor([list(k) for _, k, _ in KAT])
    assert torch.equal(noise.philox4x32(c.cuda(), k.cuda()).cpu(), noise.philox4x32(c, k))


# ------------------------------------------------------------------- the compiled kernel


@pytest.mark.slow  # torch.compile builds the kernels with the C++ compiler: about 30 s each
@pytest.mark.parametrize("transform", [noise._laplace_transform, noise._gaussian_transform])
def test_compiled_kernel_gives_the_portable_bits_without_recompiling(transform):
    """The kernel that GPUs use (one compiled graph of Philox and the transform), compiled here for the CPU
    by the same torch.compile: the same bits as the portable path, and new counters and sizes (one agent,
    one element) reuse it."""
    import torch._dynamo

    torch._dynamo.reset()
    noise._compiled_ok.clear()
    cpu = torch.device("cpu")
    assert noise._compiled_works(cpu, transform)  # compiles, then compares with the portable path
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    agents = torch.tensor([4, 1, 2**32 - 1, 0, 9])
    param = torch.tensor([1.0, 0.0, 2.5, 1e-300, 7.0], dtype=F64)
    cases = [(3, 1, 1, 7, 5), (2**32 - 1, 20000, 10, 48608, 5), (0, 2, 3, 1, 5), (5, 6, 7, 333, 1)]
    for seed, round_, step, numel, rows in cases:
        args = (seed, agents[:rows], round_, step, 0, numel, F64, transform, param[:rows])
        assert torch.equal(noise._compiled_draw(*args), noise._portable_draw(*args))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # no recompilation
