"""dpadmm.runs.memory: freed tensors of an engine's size are reused without page faults, whether the process
asks malloc itself (``dpadmm train | reproduce``) or starts with the settings (Ray's workers)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from dpadmm.runs.memory import WORKER_ENV

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the settings are glibc's")

# Twenty steps of an engine's shape on 40 MB tensors (above glibc's largest mmap threshold, as a FEMNIST
# step's): each makes a gradient, a noise draw and the new iterate, and frees the last step's. The page
# faults of the loop, and whether keep_freed_memory took.
_PROBE = """
import json, resource, sys, torch
from dpadmm.runs.memory import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "call" else None
torch.set_num_threads(1)
n = 10_000_000
z, lam = torch.ones(n), torch.ones(n)

def step(z):
    g = z * 0.5
    xi = torch.rand(n)
    return (lam - g).sub_(xi)

for _ in range(3):
    z = step(z)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    z = step(z)
print(json.dumps({"took": took, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _probe(how: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, how], capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k not in WORKER_ENV}, **(env or {})},
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_freed_tensors_are_reused_without_page_faults() -> None:
    plain = _probe("no")
    kept = _probe("call")
    started = _probe("no", WORKER_ENV)
    assert kept["took"] is True
    # plain, each step's three 40 MB tensors are ~29,000 fresh pages; kept, the steps reuse the heap's memory
    # (all of it when the process starts with the settings; most of it when it asks after its start: 12x
    # fewer faults here)
    assert plain["faults"] > 20 * 27_000
    assert kept["faults"] < plain["faults"] / 4 and started["faults"] < plain["faults"] / 20
