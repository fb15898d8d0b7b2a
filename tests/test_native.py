"""dpadmm.native: the fused C kernels against the torch code they replace, and the fallback without them."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from dpadmm import native
from dpadmm.iadmm import engine
from dpadmm.iadmm.config import papers
from dpadmm.models.logistic import AgentData, gradient, gradient_and_sensitivity, probabilities, sensitivity
from dpadmm.models.oracles import GradientSpec, LogisticOracle, poisson_taken
from dpadmm.privacy import noise

F64 = torch.float64


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    """These tests are about the kernels: CI has a C compiler, so they must build."""
    assert native.library() is not None, "the C kernels did not build (see the logged note)"


def _sparse_agents(counts=(37, 5, 60), j: int = 50, k: int = 10, density: float = 0.2, seed: int = 0,
                   dtype: torch.dtype = F64) -> AgentData:
    """Agents with rows like images: most pixels zero, a few rows all zero, unequal counts (padding)."""
    gen = torch.Generator().manual_seed(seed)
    xs = []
    for c in counts:
        x = torch.rand(c, j, generator=gen, dtype=F64) * (torch.rand(c, j, generator=gen) < density)
        x[::7] = 0.0  # all-zero rows that are real samples
        xs.append(x)
    ys = [torch.randint(0, k, (c,), generator=gen) for c in counts]
    return AgentData.from_blocks(xs, ys, num_classes=k, total=sum(counts) + 3, agents=range(len(counts)),
                                 dtype=dtype)


# ------------------------------------------------------------------------------ noise


@pytest.mark.parametrize("kind", ["uniform", "laplace", "gaussian"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_noise_is_the_torch_path_bit_for_bit(kind: str, dtype: torch.dtype) -> None:
    agents = torch.tensor([0, 3, 17, 2**32 - 1, 5])
    param = torch.tensor([1.0, 0.5, 0.0, 3.0, 1e-300], dtype=F64)
    transform = {"uniform": noise._uniform_transform, "laplace": noise._laplace_transform,
                 "gaussian": noise._gaussian_transform}[kind]
    if kind == "uniform":
        param, dtype = None, torch.float64
    # odd and even lengths, across the kernel's tiles of 2048 elements, and the counters' extremes
    for seed, round_, step, stream, numel in [(42, 5, 6, 1, 2107), (0, 0, 0, 0, 1), (7, 1, 2, 3, 4096),
                                              (2**32 - 1, 2**32 - 1, 123456, 3, 20001)]:
        fused = native.draw(kind, seed, agents, round_, step, stream, numel, param, dtype)
        portable = noise._portable_draw(seed, agents, round_, step, stream, numel, dtype, transform, param)
        assert fused.dtype == dtype and torch.equal(fused, portable)


def test_noise_does_not_depend_on_the_thread_count() -> None:
    agents, scale = torch.arange(6), torch.ones(6, dtype=F64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.draw("laplace", 3, agents, 1, 2, 0, 30001, scale, F64)
        torch.set_num_threads(max(2, threads))
        many = native.draw("laplace", 3, agents, 1, 2, 0, 30001, scale, F64)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


def test_public_draws_use_the_kernel_and_keep_their_numbers(monkeypatch) -> None:
    agents, scale = torch.arange(4), torch.tensor([1.0, 2.0, 0.5, 0.0], dtype=F64)
    fused = noise.laplace(9, agents, 3, 1, (7, 13), scale)
    calls = []
    monkeypatch.setattr(native, "draw", lambda *args: calls.append(args))  # returns None: the torch path
    assert torch.equal(noise.laplace(9, agents, 3, 1, (7, 13), scale), fused)
    assert len(calls) == 1


# ------------------------------------------------------------------------ column blocks


@pytest.mark.parametrize("counts", [(37, 5, 60), (300, 600, 1)])  # one block per agent; several, and padding
def test_column_blocks_hold_exactly_the_nonzeros(counts) -> None:
    data = _sparse_agents(counts=counts)
    blk, col, ptr, row, val = data.blocks
    agents, rows, features = data.x.shape
    per_agent = -(-rows // native.ROW_BLOCK)
    rebuilt = torch.zeros_like(data.x)
    for p in range(agents):
        for b in range(per_agent):
            for c in range(int(blk[p * per_agent + b]), int(blk[p * per_agent + b + 1])):
                entries = slice(int(ptr[c]), int(ptr[c + 1]))
                assert int(ptr[c + 1]) > int(ptr[c])  # only columns with a nonzero are listed
                assert torch.all(row[entries][1:] > row[entries][:-1])  # rows in order
                rebuilt[p, b * native.ROW_BLOCK + row[entries].long(), int(col[c])] = val[entries]
    assert torch.equal(rebuilt, data.x) and val.numel() == int((data.x != 0).sum())


def test_dense_data_keep_the_batched_products() -> None:
    dense = AgentData.from_blocks([torch.rand(9, 5, dtype=F64)], [torch.zeros(9, dtype=torch.int64)],
                                  num_classes=3, total=9, agents=[0])
    assert dense.blocks is None  # more than SPARSE_ENOUGH nonzero: torch's products
    assert native.column_blocks(dense.x, max_density=1.0) is not None


# ----------------------------------------------------------------------------- gradient


@pytest.mark.parametrize("runs", [None, 3])
@pytest.mark.parametrize(("clip", "norm"), [(None, "l1"), (0.7, "l1"), (0.4, "l2"), (1e6, "l1")])
@pytest.mark.parametrize("classes", [10, 62, 3])
def test_gradient_is_the_torch_definition(runs: int | None, clip: float | None, norm: str,
                                          classes: int) -> None:
    data = _sparse_agents(k=classes)
    assert data.blocks is not None
    gen = torch.Generator().manual_seed(5)
    shape = (3, 50, classes) if runs is None else (runs, 3, 50, classes)
    z = torch.randn(shape, generator=gen, dtype=F64)
    probs = probabilities(data.x, z)  # given probs: the torch code, the definition
    reference = gradient(data, z, scale=1 / data.total, reg=0.3, probs=probs, clip=clip, norm=norm)
    fused = gradient(data, z, scale=1 / data.total, reg=0.3, clip=clip, norm=norm)
    torch.testing.assert_close(fused, reference, rtol=1e-12, atol=1e-14)
    g, delta = gradient_and_sensitivity(data, z, scale=1 / data.total, reg=0.3, clip=clip, norm=norm)
    assert torch.equal(g, fused)
    torch.testing.assert_close(delta, sensitivity(data, probs), rtol=1e-13, atol=0)


@pytest.mark.parametrize("runs", [None, 1, 3])
def test_the_kernels_layout_needs_no_padding(runs: int | None) -> None:
    """z [(S,) P, J, K] goes to the kernels as [P, J, S K] with no padded columns (the rows' tails are
    computed one value at a time), and one run's z without a copy: a FEMNIST step reads and writes its
    38 MB of z and g once."""
    z = torch.randn((3, 50, 62) if runs is None else (runs, 3, 50, 62), dtype=torch.float32)
    zt, s, width = native._runs_side_by_side(z)
    assert (s, width, tuple(zt.shape)) == ((runs or 1), (runs or 1) * 62, (3, 50, (runs or 1) * 62))
    if (runs or 1) == 1:
        assert zt.data_ptr() == z.data_ptr()
    assert torch.equal(native._runs_apart(zt, z), z)


def test_gradient_with_per_agent_scale_and_float32() -> None:
    data = _sparse_agents(seed=2)
    z = torch.randn(3, 50, 10, dtype=F64, generator=torch.Generator().manual_seed(1))
    reference = gradient(data, z, scale=1 / data.counts, reg=0.1, probs=probabilities(data.x, z))
    torch.testing.assert_close(gradient(data, z, scale=1 / data.counts, reg=0.1), reference,
                               rtol=1e-12, atol=1e-14)
    data32 = _sparse_agents(seed=2, dtype=torch.float32)
    assert data32.blocks is not None
    got = gradient(data32, z.float(), scale=1 / data32.total, reg=0.1)
    want = gradient(data32, z.float(), scale=1 / data32.total, reg=0.1,
                    probs=probabilities(data32.x, z.float()))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_an_agent_alone_gets_the_same_bits_as_in_the_batch() -> None:
    """The Flower client (one agent) and the engine (all of them) compute the same numbers, whatever the
    thread count."""
    data = _sparse_agents()
    z = torch.randn(3, 50, 10, dtype=F64, generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(2, threads))
        batched = gradient_and_sensitivity(data, z, scale=1 / data.total, reg=0.2, clip=0.5)
        torch.set_num_threads(1)
        for p in range(3):
            alone = data.select(slice(p, p + 1))
            g, delta = gradient_and_sensitivity(alone, z[p:p + 1], scale=1 / data.total, reg=0.2, clip=0.5)
            assert torch.equal(g[0], batched[0][p]) and torch.equal(delta[0], batched[1][p])
    finally:
        torch.set_num_threads(threads)


def test_engine_rounds_equal_with_and_without_kernels(monkeypatch) -> None:
    """Five rounds of ObjPM (clipped) and ObjP (eq. (9b)) on the embedded MNIST sample: the same w up to
    rounding, and the same noise magnitudes (the noise is the same bits)."""
    for config in (papers(algorithm="objpm", epsilon=1.0, local_steps=2, rounds=5, eval_every=5),
                   papers(algorithm="objp", epsilon=1.0, rounds=5, eval_every=5,
                             sensitivity="data-dependent")):
        fused = engine.run(config, write=False, progress=False)
        with monkeypatch.context() as patch:
            patch.setattr(native, "library", lambda: None)
            portable = engine.run(dataclasses.replace(config), write=False, progress=False)
        torch.testing.assert_close(fused.state.w, portable.state.w, rtol=1e-9, atol=1e-12)
        assert fused.records[-1]["noise-magnitude"] == pytest.approx(portable.records[-1]["noise-magnitude"],
                                                                     rel=1e-9)


# ----------------------------------------------------------------------------- fallback


def _in_fresh_process(code: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, check=True)
    return {"stderr": done.stderr, **json.loads(done.stdout.strip().splitlines()[-1])}


_PROBE = """
import json, logging, torch
logging.basicConfig(level=logging.INFO)
from dpadmm import native
from dpadmm.privacy import noise
x = noise.laplace(1, torch.arange(3), 2, 1, (101,), torch.ones(3, dtype=torch.float64))
print(json.dumps({"native": native.library() is not None, "sum": float(x.sum()),
                  "bits": x.flatten().tolist()}))
"""


@pytest.mark.slow
def test_without_a_compiler_the_torch_path_runs_with_a_note(tmp_path) -> None:
    """No compiler, a compiler that fails, or the kernels turned off: the torch path, the same noise, and a
    note saying why; a build says first that it compiles (the first run on a machine waits for it)."""
    failing = tmp_path / "failing-cc"  # answers --version, fails to compile
    failing.write_text("#!/bin/sh\n"
                       "[ \"$1\" = --version ] && { echo failing-cc 1.0; exit 0; }\n"
                       "echo no >&2; exit 1\n")
    failing.chmod(0o755)
    built = _in_fresh_process(_PROBE)
    broken = _in_fresh_process(_PROBE, CC=str(tmp_path / "no-such-cc"), DPADMM_CACHE=str(tmp_path / "cache"))
    failed = _in_fresh_process(_PROBE, CC=str(failing), DPADMM_CACHE=str(tmp_path / "cache"))
    off = _in_fresh_process(_PROBE, DPADMM_NATIVE="0")
    assert built["native"] and not broken["native"] and not failed["native"] and not off["native"]
    assert "C kernels are not available" in broken["stderr"] and "no-such-cc" in broken["stderr"]
    assert "compiling the C kernels for this machine, once" not in broken["stderr"]
    said = failed["stderr"]
    assert said.index("compiling the C kernels for this machine, once") < said.index("are not available")
    assert "DPADMM_NATIVE=0" in off["stderr"]
    assert built["bits"] == broken["bits"] == failed["bits"] == off["bits"]  # the same noise on every path
    assert math.isfinite(built["sum"])


@pytest.mark.parametrize("runs", [None, 3])
@pytest.mark.parametrize(("clip", "norm"), [(None, "l1"), (0.7, "l1"), (0.4, "l2")])
@pytest.mark.parametrize("classes", [10, 62, 3])
def test_the_sampled_gradient_is_the_gathered_samples(runs: int | None, clip: float | None, norm: str,
                                                      classes: int) -> None:
    """The Poisson-sampled kernel (rows read one by one, only those some run took) against the torch path
    that gathers each run's sample into a dense batch; and an agent alone gets the bits it gets batched."""
    data = _sparse_agents(k=classes)
    assert data.rows is not None
    seeds = [4] if runs is None else [4, 8, 11]
    gen = torch.Generator().manual_seed(7)
    z = torch.randn((3, 50, classes) if runs is None else (runs, 3, 50, classes), generator=gen, dtype=F64)
    spec = GradientSpec(sampling=0.3, clip=clip, norm=norm, beta=0.3, num_agents=3,
                        neighbouring="add-remove", seed=4)
    oracle = LogisticOracle(spec, data, seeds)
    fused, _ = oracle.gradient(z, 2, 5)
    gathered = oracle._gathered(z, poisson_taken(seeds, data, 2, 5, 0.3), 1 / (0.3 * data.total))
    torch.testing.assert_close(fused, gathered, rtol=1e-12, atol=1e-14)
    for p in range(3):
        alone = LogisticOracle(spec, data.select(slice(p, p + 1)), seeds)
        own, _ = alone.gradient(z[..., p:p + 1, :, :], 2, 5)
        assert torch.equal(own[..., 0, :, :], fused[..., p, :, :])


def test_the_sampled_gradient_in_float32() -> None:
    data = _sparse_agents(seed=2, dtype=torch.float32)
    z = torch.randn(3, 50, 10, generator=torch.Generator().manual_seed(1)).float()
    spec = GradientSpec(sampling=0.5, clip=1.0, norm="l2", beta=0.1, num_agents=3,
                        neighbouring="add-remove", seed=0)
    oracle = LogisticOracle(spec, data)
    got, _ = oracle.gradient(z, 1, 1)
    want = oracle._gathered(z, poisson_taken([0], data, 1, 1, 0.5), 1 / (0.5 * data.total))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
