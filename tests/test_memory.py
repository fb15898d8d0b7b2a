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


@pytest.mark.slow  # three processes import torch and page through 2.4 GB
def test_freed_tensors_are_reused_without_page_faults() -> None:
    plain = _probe("no")
    kept = _probe("call")
    started = _probe("no", WORKER_ENV)
    assert kept["took"] is True
    # plain, each step's three 40 MB tensors are ~29,000 fresh pages; kept, the steps reuse the heap's memory
    # (all or most of it when the process starts with the settings; most of it when it asks after its start)
    assert plain["faults"] > 20 * 27_000
    assert kept["faults"] < plain["faults"] / 4 and started["faults"] < plain["faults"] / 4


# The dpadmm command (main() reading sys.argv) and a caller of main(argv): is a 40 MB tensor then mapped
# by its own mmap? `train --rounds 0` stops at the configuration's check, after malloc was set.
_COMMAND = """
import ctypes, json, sys, torch
from dpadmm import cli
how = sys.argv[1]
sys.argv = ["dpadmm", "train", "--rounds", "0"]
try:
    cli.main() if how == "command" else cli.main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Info
before = mallinfo2().hblkhd
t = torch.ones(10_000_000)
print(json.dumps({"exit": code, "mapped": mallinfo2().hblkhd - before}))
"""


@pytest.mark.slow
def test_the_dpadmm_command_keeps_freed_memory_and_a_caller_of_main_is_left_alone() -> None:
    def probe(how: str) -> dict:
        done = subprocess.run([sys.executable, "-c", _COMMAND, how], capture_output=True, text=True,
                              timeout=120, env={k: v for k, v in os.environ.items() if k not in WORKER_ENV},
                              check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    command, caller = probe("command"), probe("caller")
    assert command["exit"] == caller["exit"] == 2  # rounds=0 refused
    assert command["mapped"] == 0  # from the heap
    assert caller["mapped"] >= 40_000_000  # its own mmap, as glibc does by default
