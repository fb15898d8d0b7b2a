"""A malicious server attacks a real deployment through channels built to tell it about a device's data
outside any release; each attack is answered alike on a data set D and its neighbour D'.

Not a module of the project: the attacks' target is the device as a whole (clients.gate, the installed
ClientApp, `dpadmm node serve` under `flwr-supernode`), reached as a server reaches it. A TLS SuperLink with
SuperNode authentication and four SuperNodes started with `dpadmm deploy supernode`
(:class:`tests.conftest.Deployment`), each with its own state folder and policy: two DP-IADMM agents
(both partition 0) holding D and D' = D plus one sample, two ADMM-sharing parties (both party 0) holding D
and D' = D with one row replaced. The server is a FAB of the app's name and version whose ServerApp is
tests/attacking_server_app.py (the devices answer with their installed code, but the server side of a run is
the FAB's): it sends crafted messages to the pair of nodes and writes what each answered. Whether a node
answers, refuses (and the text) or fails must be the same on D and D', byte for byte: otherwise one run tells
the server, noise-free, whether the sample is there. (The lifetime budget's refusal at the query is attacked
in tests/test_runtime.py, on a deployment whose devices have a lifetime budget to spend.)
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients.gate import EVALUATE_REFUSED, MAX_ABS
from dpadmm.privacy.device import POLICY_FILE, Device
from dpadmm.sharing.config import SharingConfig
from dpadmm.wire import DUAL_KEY, PULLED_KEY
from tests.conftest import ROOT, TEST_POLICY, Deployment, last_run_status, run_config_of, shipped_app

pytestmark = pytest.mark.slow

PIXELS = (0, 783)  # two corner pixels: no digit of the MNIST sample has ink there
SAMPLES = 300  # D's size: D' has one more
CLASSES = 10
PARTIES = (66, 57)
STATES = ("state-d", "state-d-prime")  # D's device's state folder, D''s


def _mnist_pair(root: Path) -> tuple[Path, Path]:
    """D: the first SAMPLES digits of the MNIST sample not labelled 9 (none has ink on PIXELS); D': D and a 9
    whose PIXELS are both bright, the sample that both channels of the attack look for."""
    from dpadmm.iadmm.config import papers
    from dpadmm.iadmm.federation import load_for

    dataset = load_for(papers(num_agents=2))
    pixels = np.rint(dataset.x_train.numpy() * 255).astype(np.uint8)
    labels = dataset.y_train.numpy()
    kept = np.flatnonzero(labels != CLASSES - 1)[:SAMPLES]
    nine = pixels[np.flatnonzero(labels == CLASSES - 1)[0]].copy()
    nine[list(PIXELS)] = 255
    np.savez(root / "d.npz", x=pixels[kept], y=labels[kept])
    np.savez(root / "d-prime.npz", x=np.vstack([pixels[kept], nine]), y=np.append(labels[kept], CLASSES - 1))
    return root / "d.npz", root / "d-prime.npz"


def _running(d: Deployment, files: tuple[Path, Path], neighbouring: str, settings: str = ""
             ) -> Iterator[Deployment]:
    """``d`` with two SuperNodes running, both partition 0, one reading D (``files[0]``), one D'
    (``files[1]``), with ``settings`` more in their node configs, each with its own state folder and its
    operator's policy (the tests' budget, ``neighbouring``)."""
    policy = dataclasses.replace(TEST_POLICY, neighbouring=neighbouring)
    configs = []
    for name, path in zip(STATES, files, strict=True):
        state = d.root / name
        state.mkdir()
        (state / POLICY_FILE).write_text(policy.to_toml())
        configs.append(f"partition-id=0 data-path='{path}' {settings}state-dir='{state}'")
    d.prepare(["node-0", "node-1"])
    with d.running(configs):
        yield d


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Two DP-IADMM agents holding D and D' (:func:`_mnist_pair`), under the main job's relation."""
    d = Deployment(tmp_path_factory.mktemp("attacked-agents"), nodes=2)
    total = 2 * (SAMPLES + 1)  # I, the run's public sample count
    yield from _running(d, _mnist_pair(d.root), "add-remove", f"num-samples-total={total} ")


@pytest.fixture(scope="module")
def parties(tmp_path_factory: pytest.TempPathFactory, binary_dir: Path) -> Iterator[Deployment]:
    """Two ADMM-sharing parties, both party 0 of the a9a split, holding D and D' = D with one row's features
    replaced, under 001's relation (one sample replaced)."""
    d = Deployment(tmp_path_factory.mktemp("attacked-parties"), nodes=2)
    files = d.root / "files"
    d.dpadmm("deploy", "vertical", "--dataset", "a9a", "--data-dir", str(binary_dir / "a9a"),
             "--parties", ",".join(map(str, PARTIES)), "--out", str(files))
    with np.load(files / "party-0.npz") as own:
        x = own["x"].copy()
        x[0] = 1.0 - x[0]
        np.savez(files / "party-0-replaced.npz", ids=own["ids"], x=x, test_ids=own["test_ids"],
                 x_test=own["x_test"])
    yield from _running(d, (files / "party-0.npz", files / "party-0-replaced.npz"), "replace-one")


def _node_ids(d: Deployment) -> dict[str, int]:
    """D's and D''s node ids, as each SuperNode logged its own when the SuperLink accepted it."""
    ids = {}
    for i, name in enumerate(("D", "D'")):
        [node_id] = re.findall(r"SuperNode ID: (\d+)", (d.root / f"supernode-{i}.log").read_text())
        ids[name] = int(node_id)
    return ids


def _attack(d: Deployment, run_config: str, steps: list[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Run the attacking FAB with ``run_config``, sending ``steps`` to D's node and D''s:
    {step: {"D": [status, text], "D'": [status, text]}}."""
    app = d.root / "attacking-app"
    plan = d.root / "plan.json"
    if not app.exists():
        shutil.copytree(shipped_app(), app)
        code = (ROOT / "tests" / "attacking_server_app.py").read_text()
        (app / "server" / "server_app.py").write_text(code.replace('PLAN = ""', f"PLAN = {str(plan)!r}", 1))
    out = d.root / "outcomes.json"
    out.unlink(missing_ok=True)
    plan.write_text(json.dumps({"nodes": _node_ids(d), "steps": steps,
                                "timeout": 180, "out": str(out)}))
    d.submit(run_config, "attacks.log", app).wait(timeout=600)
    status, details = last_run_status(d.env, d.connection)
    assert status == "finished:completed" and out.exists(), (status, details,
                                                              (d.root / "attacks.log").read_text()[-3000:])
    return json.loads(out.read_text())


def _model(classes: int, value: float = 0.0) -> dict[str, Any]:
    """DP-IADMM's w, lambda_p and z, [784, classes] float64; w and z at ``value`` on both PIXELS of class
    0."""
    shape = {"shape": [784, classes], "dtype": "float64"}
    bright = {**shape, "set": [[pixel, 0, value] for pixel in PIXELS] if value else []}
    return {"w.weight": bright, "lambda.weight": shape, "z.weight": bright}


def _train(name: str, arrays: dict[str, Any], **config: int) -> dict[str, Any]:
    return {"name": name, "kind": "train", "arrays": arrays,
            "config": {"partition-id": 0, "server-round": 1, **config}}


QUERY = {"name": "query", "kind": "query", "config": {"query": "partition-id"}}


def test_dpiadmm_overflow_and_label_count_are_answered_alike_on_d_and_d_prime(agents: Deployment) -> None:
    """beta = 0 and w, z at 1e308 on two pixels (a sample's logit overflowed iff both are bright: D failed, D'
    answered) and a w of 9 classes (the refusal named the device's largest label: D' has a 9) are refused by
    the gate, with one text on both; the overflow at the largest value the gate admits, 2**40, is answered on
    both (total clipping, no overflow left to decide it)."""
    outcomes = _attack(agents, "iadmm.num-agents=2 iadmm.rounds=2 iadmm.beta=0.0", [
        QUERY,
        _train("overflow at 1e308", _model(CLASSES, 1e308)),
        _train("9 classes", _model(CLASSES - 1)),
        _train("overflow at 2**40", _model(CLASSES, MAX_ABS)),
    ])
    for step, said in outcomes.items():
        assert said["D"] == said["D'"], (step, said)
    seen = {step: said["D"] for step, said in outcomes.items()}
    assert seen["overflow at 1e308"] == ["refused", "the server's array 'w.weight' has an entry of magnitude "
                                                    "1e+308; this node accepts at most 2**40"]
    assert seen["9 classes"] == ["refused", "the server's array 'lambda.weight' is float64 of shape "
                                            "[784, 9]; this node's is float32 or float64 of shape [784, 10]"]
    assert seen["query"][0] == seen["overflow at 2**40"][0] == "answered"
    # the main job's release=last: z is the last iterate, so no z-last beside it
    assert json.loads(seen["overflow at 2**40"][1])["arrays"] == {"z.weight": [784, CLASSES]}
    states = [agents.root / name for name in STATES]
    assert [len(Device(state, 0).charges()) for state in states] == [1, 1]  # the one release, on both


def test_a_sharing_party_refuses_evaluate_alike_on_d_and_d_prime(parties: Deployment) -> None:
    """After a round, an evaluate message used to bring a party's test scores, a noise-free function of its
    training rows (D and D' gave other scores); both parties now refuse it with one text."""
    config = SharingConfig(epsilon=1.0, rounds=3, x_bound=0.5, seed=5, parties=",".join(map(str, PARTIES)),
                           labels_path=str(parties.root / "files" / "labels.npz"))
    with np.load(parties.root / "files" / "labels.npz") as labels:
        n = int(labels["y"].shape[0])
    vector = {"shape": [n], "dtype": "float64"}
    outcomes = _attack(parties, run_config_of(config), [
        QUERY,
        _train("round 1", {PULLED_KEY: vector, DUAL_KEY: vector}, **{"own-round": 0}),
        {"name": "evaluate", "kind": "evaluate", "config": {"server-round": 1, "partition-id": 0}},
    ])
    for step, said in outcomes.items():
        assert said["D"] == said["D'"], (step, said)
    assert [said["D"][0] for said in outcomes.values()] == ["answered", "answered", "refused"]
    assert outcomes["evaluate"]["D"][1] == EVALUATE_REFUSED
