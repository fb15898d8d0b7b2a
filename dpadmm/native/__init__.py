"""Fused CPU kernels in C, built on first use with the machine's C compiler and loaded with ctypes.

Why: on a CPU torch's elementwise calls cannot fuse. The keyed Philox noise in portable torch
arithmetic is about 350 calls per chunk, each a pass over memory; the logistic gradient is two
skinny batched matrix products with a softmax between them, each reading all of X. Here each is
one pass: :func:`draw` computes the same bits as :mod:`dpadmm.privacy.noise`'s torch path, several times
faster, and :func:`logistic_gradient` computes :func:`dpadmm.models.logistic.gradient` (up to
floating-point rounding) reading each agent's nonzero pixels once, while a row's logits and
residual are in cache. ``docs/benchmarks.md`` has the numbers.

How: the C source (:mod:`dpadmm.native.source`) is compiled once per machine and source
into a cache folder (``$DPADMM_CACHE``, else ``~/.cache/dpadmm``), with the constants of the
noise transforms taken from :mod:`dpadmm.privacy.noise`, so there is one definition of each. The
flags keep IEEE arithmetic exact (``-ffp-contract=off``, no fast-math): the noise is the
same on every machine and compiler. Where there is no compiler or the build fails, or with
``DPADMM_NATIVE=0``, every caller keeps the torch path (a note is logged once): the same
noise bits, the same gradient up to rounding, only slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from dpadmm.native import source as native_source
from dpadmm.privacy import transforms

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-std=gnu11", "-shared", "-fPIC",
         "-fopenmp")
ROW_BLOCK = 256  # rows per column block (their logits stay in cache; a row's number in its block is one byte)
NOISE_KINDS = {"uniform": 0, "laplace": 1, "gaussian": 2}

_F64, _I64 = ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int64)


def _array(values: tuple[float, ...]) -> str:
    return "{" + ", ".join(float.hex(v) for v in values) + "}"


def source() -> str:
    """The C source with the transforms' constants of :mod:`dpadmm.privacy.noise` (hex floats: exact)."""
    exp_coeffs = [1.0]
    for j in range(1, 14):
        exp_coeffs.append(exp_coeffs[-1] / j)
    defines = {
        "LN2_HI": float.hex(transforms.LN2_HI),
        "LN2_LO": float.hex(transforms.LN2_LO),
        "SQRT_MAGIC": f"{transforms.SQRT_MAGIC}LL",
        "HALF_PI": float.hex(transforms.HALF_PI),
        "ROW_BLOCK": str(ROW_BLOCK),
    }
    arrays = {"LOG_C": transforms.LOG_COEFFS, "SIN_C": transforms.SIN_COEFFS, "COS_C": transforms.COS_COEFFS,
              "EXP_C": tuple(exp_coeffs)}
    head = [f"#define {k} {v}" for k, v in defines.items()]
    head += [f"static const double {k}[{len(v)}] = {_array(v)};" for k, v in arrays.items()]
    includes, body = native_source.SOURCE.split("/* ---", 1)
    parts = [includes, "\n".join(head), "\n\n/* ---", body]
    for real, suffix in (("double", "f64"), ("float", "f32")):
        parts.append(f"\n#define real_t {real}\n#define vec_t vec_{suffix}\n#define vec2_t vec2_{suffix}\n"
                     f"#define FN(name) CAT(name, _{suffix})\n")
        parts.append(native_source.GRADIENT)
        specialised = native_source.SPECIALISED
        for kernel, prefix, table_name in (("agent", "w", "by_width"), ("sampled", "s", "sampled_by_width")):
            for nv, nt in specialised:
                parts.append(f"static void FN({prefix}{nv}_{nt})(void *job, int64_t p) "
                             f"{{ FN({kernel})(job, p, {nv}, {nt}); }}\n")
            table = ", ".join(f"{{{nv}, {nt}, FN({prefix}{nv}_{nt})}}" for nv, nt in specialised)
            parts.append(f"static const struct {{ int64_t nv, nt; task_fn fn; }} FN({table_name})[] = "
                         f"{{{table}}};\n")
        parts.append(native_source.ENTRY)
        parts.append("#undef real_t\n#undef vec_t\n#undef vec2_t\n#undef FN\n")
    return "".join(parts)


def _machine() -> str:
    """What the build depends on besides the source: the CPU's features and the compiler."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {flags}"


def _cache_dir() -> Path:
    return Path(os.environ.get("DPADMM_CACHE") or Path.home() / ".cache" / "dpadmm")


def _build() -> Path:
    """Compile the source into the cache (atomically: concurrent builds by Ray workers are harmless)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("no C compiler (cc, gcc or $CC) on PATH")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    text = source()
    key = hashlib.sha256("\0".join([text, " ".join(FLAGS), version, _machine()]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"dpadmm-native-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Said, not only logged at INFO: the first run on a machine waits for it (about 40 s of CPU), once.
    log.warning("dpadmm.native: compiling the C kernels for this machine, once (about 40 s of CPU); they are "
                "kept in %s", target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        c_file, so_file = Path(tmp) / "native.c", Path(tmp) / "native.so"
        c_file.write_text(text)
        done = subprocess.run([compiler, *FLAGS, str(c_file), "-o", str(so_file), "-lm"], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")
        os.replace(so_file, target)
    return target


@cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (torch paths are used; the reason is logged once)."""
    if os.environ.get("DPADMM_NATIVE", "1") == "0":
        log.info("dpadmm.native is off (DPADMM_NATIVE=0); the torch paths are used")
        return None
    try:
        lib = ctypes.CDLL(str(_build()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning("dpadmm.native: the C kernels are not available (%s); using the torch paths, which give "
                    "the same noise and the same gradients up to rounding, more slowly", error)
        return None
    c_int, c_u32, c_i64, c_dbl, c_void = ctypes.c_int, ctypes.c_uint32, ctypes.c_int64, ctypes.c_double, \
        ctypes.c_void_p
    lib.dp_noise.argtypes = [c_int, c_u32, _I64, c_i64, c_u32, c_u32, c_u32, c_i64, _F64, c_void, c_int,
                             c_int]
    lib.dp_noise.restype = None
    for suffix in ("f64", "f32"):
        getattr(lib, f"dp_blocks_{suffix}").argtypes = [c_void, c_i64, c_i64, c_i64, c_int, _I64, c_void,
                                                       _I64, c_void, c_void]
        getattr(lib, f"dp_blocks_{suffix}").restype = None
        getattr(lib, f"dp_logistic_grad_{suffix}").argtypes = [
            c_i64, c_i64, c_i64, c_i64, c_i64, c_i64, _I64, c_void, _I64, c_void, c_void, c_void, c_void,
            c_void, c_void, c_dbl, c_int, c_void, c_dbl, c_void, _F64, c_int]
        getattr(lib, f"dp_logistic_grad_{suffix}").restype = None
        getattr(lib, f"dp_logistic_grad_sampled_{suffix}").argtypes = [
            c_i64, c_i64, c_i64, c_i64, c_i64, c_i64, _I64, c_void, c_void, _I64, _I64, c_void, c_void,
            c_void, c_void, c_void, c_dbl, c_int, c_void, c_dbl, c_void, c_int]
        getattr(lib, f"dp_logistic_grad_sampled_{suffix}").restype = None
    return lib


def _ptr(t: torch.Tensor, kind=ctypes.c_void_p):
    return ctypes.cast(t.data_ptr(), kind)


_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}


def draw(kind: str, seed: int, agents: torch.Tensor, round_: int, step: int, stream: int, numel: int,
         param: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """[P, numel] keyed draws as :func:`dpadmm.privacy.noise._draw` computes them (arguments checked), or
    None where the kernel cannot run (not on CPU, a dtype other than float32/64, no library)."""
    lib = library()
    if lib is None or agents.device.type != "cpu" or dtype not in _SUFFIX:
        return None
    agents = agents.contiguous()
    out = torch.empty((agents.shape[0], numel), dtype=dtype)
    param_ptr = None
    if param is not None:
        param = param.to(torch.float64).contiguous()
        param_ptr = _ptr(param, _F64)
    lib.dp_noise(NOISE_KINDS[kind], seed, _ptr(agents, _I64), agents.shape[0], round_, step, stream, numel,
                 param_ptr, _ptr(out), int(dtype == torch.float32), torch.get_num_threads())
    return out


Blocks = tuple[torch.Tensor, ...]  # (blk, col, ptr, row, val) of :func:`column_blocks`


def column_blocks(x: torch.Tensor, max_density: float = 1.0) -> Blocks | None:
    """x [P, I, J] as column blocks (see dp_blocks in the source): each agent's rows in blocks of
    :data:`ROW_BLOCK`, and in a block each column's nonzero entries. None where the kernels do not run,
    or where more than ``max_density`` of x is nonzero."""
    lib = library()
    if lib is None or x.device.type != "cpu" or x.dtype not in _SUFFIX:
        return None
    x = x.contiguous()
    agents, rows, features = x.shape
    build = getattr(lib, f"dp_blocks_{_SUFFIX[x.dtype]}")
    blk = torch.zeros(agents * -(-rows // ROW_BLOCK) + 1, dtype=torch.int64)
    totals = torch.zeros(1, dtype=torch.int64)
    build(_ptr(x), agents, rows, features, 0, _ptr(blk, _I64), None, _ptr(totals, _I64), None, None)
    columns, entries = int(blk[-1]), int(totals[0])
    if entries > max_density * x.numel():
        return None
    col = torch.empty(columns, dtype=torch.int32)
    ptr = torch.empty(columns + 1, dtype=torch.int64)
    row = torch.empty(entries, dtype=torch.uint8)
    val = torch.empty(entries, dtype=x.dtype)
    build(_ptr(x), agents, rows, features, 1, _ptr(blk, _I64), _ptr(col), _ptr(ptr, _I64), _ptr(row),
          _ptr(val))
    return blk, col, ptr, row, val


def logistic_gradient(blocks: Blocks, y: torch.Tensor,
                      x_l1: torch.Tensor, x_l2: torch.Tensor, z: torch.Tensor, *, scale: torch.Tensor | float,
                      reg: float, clip: float | None, norm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, worst) for :func:`dpadmm.models.logistic.gradient`'s arguments: ``blocks`` =
    :func:`column_blocks` of X [P, I, J], y [P, I, K], the row norms [P, I], z [(S,) P, J, K]; g like z,
    worst [(S,) P] the largest ||x_i||_1 ||h_i - y_i||_1 (eq. (9b) times I). Needs :func:`library`."""
    lib = library()
    zt, runs, width = _runs_side_by_side(z)
    agents, features, classes = zt.shape[0], zt.shape[1], z.shape[-1]
    scales = torch.as_tensor(scale, dtype=z.dtype).expand(agents).contiguous()
    g = torch.empty_like(zt)
    worst = torch.empty((agents, runs), dtype=torch.float64)
    blk, col, ptr, row, val = blocks
    y, x_l1, x_l2 = y.contiguous(), x_l1.contiguous(), x_l2.contiguous()
    getattr(lib, f"dp_logistic_grad_{_SUFFIX[z.dtype]}")(
        agents, y.shape[1], features, classes, runs, width, _ptr(blk, _I64), _ptr(col), _ptr(ptr, _I64),
        _ptr(row), _ptr(val), _ptr(y), _ptr(x_l1), _ptr(x_l2), _ptr(zt), -1.0 if clip is None else clip,
        int(norm == "l2"), _ptr(scales), 2.0 * reg, _ptr(g), _ptr(worst, _F64), torch.get_num_threads())
    worst = worst.to(z.dtype).T.contiguous()
    return _runs_apart(g, z), (worst.view(z.shape[:-2]) if z.dim() == 4 else worst[0])


Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (rowptr, col, val) of :func:`csr_rows`


def csr_rows(x: torch.Tensor) -> Rows:
    """x [P, I, J] row by row (CSR over the P I rows): rowptr [P I + 1] int64, the columns (int32, in
    increasing order within a row) and the values of the nonzero entries; for
    :func:`sampled_gradient`, which reads only the rows a Poisson sample takes."""
    flat = x.reshape(-1, x.shape[-1])
    nonzero = flat != 0
    rowptr = torch.zeros(flat.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(nonzero.sum(dim=1), dim=0, out=rowptr[1:])
    columns = nonzero.nonzero()[:, 1].to(torch.int32)  # row-major: each row's columns in increasing order
    return rowptr, columns.contiguous(), flat[nonzero].contiguous()


def sampled_gradient(rows: Rows, y: torch.Tensor, x_l1: torch.Tensor, x_l2: torch.Tensor, z: torch.Tensor,
                     taken: torch.Tensor, *, scale: float, reg: float, clip: float | None,
                     norm: str) -> torch.Tensor:
    """g = scale sum over each run's Poisson sample of clip(x_i (h_i - y_i)^T) + 2 reg z, like z
    [(S,) P, J, K]: :func:`dpadmm.models.logistic.gradient` over the rows ``taken`` [S, P, I] marks for each
    run, from :func:`csr_rows` of X [P, I, J]. Needs :func:`library`."""
    lib = library()
    zt, runs, width = _runs_side_by_side(z)
    agents, features, classes = zt.shape[0], zt.shape[1], z.shape[-1]
    if taken.shape != (runs, agents, y.shape[1]):
        raise ValueError(f"taken of shape {tuple(taken.shape)} does not match (runs, agents, rows) = "
                         f"{(runs, agents, y.shape[1])}")
    flags = taken.permute(1, 2, 0).to(torch.uint8).contiguous()  # [P, I, S]: a row's runs side by side
    some = taken.any(dim=0)  # [P, I]: the rows some run took
    chosen = some.nonzero()[:, 1].contiguous()  # their numbers, agent by agent, increasing
    first = torch.zeros(agents + 1, dtype=torch.int64)
    first[1:] = some.sum(dim=1).cumsum(0)
    scales = torch.full((agents,), scale, dtype=z.dtype)
    g = torch.empty_like(zt)
    rowptr, col, val = rows
    y, x_l1, x_l2 = y.contiguous(), x_l1.contiguous(), x_l2.contiguous()
    getattr(lib, f"dp_logistic_grad_sampled_{_SUFFIX[z.dtype]}")(
        agents, y.shape[1], features, classes, runs, width, _ptr(rowptr, _I64), _ptr(col), _ptr(val),
        _ptr(chosen, _I64), _ptr(first, _I64), _ptr(flags), _ptr(y), _ptr(x_l1), _ptr(x_l2), _ptr(zt),
        -1.0 if clip is None else clip, int(norm == "l2"), _ptr(scales), 2.0 * reg, _ptr(g),
        torch.get_num_threads())
    return _runs_apart(g, z)


def _runs_side_by_side(z: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """z [(S,) P, J, K] in the kernels' layout [P, J, S K]: each feature's S K values side by side; with the
    number of runs S and the width S K. One run's z is that layout already (no copy)."""
    runs = z.shape[0] if z.dim() == 4 else 1
    agents, features, classes = z.shape[-3:]
    if runs == 1:
        return z.reshape(agents, features, classes).contiguous(), 1, classes
    return z.permute(1, 2, 0, 3).reshape(agents, features, runs * classes).contiguous(), runs, runs * classes


def _runs_apart(g: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The kernels' [P, J, S K] result back in z's shape [(S,) P, J, K]."""
    runs = z.shape[0] if z.dim() == 4 else 1
    if runs == 1:
        return g.view(z.shape)
    agents, features, classes = z.shape[-3:]
    return g.reshape(agents, features, runs, classes).permute(2, 0, 1, 3).contiguous()
