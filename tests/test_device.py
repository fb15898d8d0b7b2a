"""The device's own privacy (dpadmm.privacy.device): its policy and its budget across runs, attacked as a
malicious server would, through the real ClientApp code on a deployed node's state folder."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from clients.dpiadmm import train_reply
from dpadmm import wire
from dpadmm.cli import main
from dpadmm.decentral import privacy as decentral_privacy
from dpadmm.decentral.config import DecentralConfig
from dpadmm.iadmm import privacy as iadmm_privacy
from dpadmm.iadmm.config import RunConfig, main_job, papers
from dpadmm.linadmm import privacy as linadmm_privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.models.logistic import AgentData
from dpadmm.privacy.device import (
    BUDGET_SUFFIX,
    Device,
    DeviceRefused,
    Policy,
    RunCost,
    RunRequest,
    policy_in_force,
    read_policy,
    status,
)
from dpadmm.privacy.randomness import NodeSecret, new_run_identity
from dpadmm.sharing import privacy as sharing_privacy
from dpadmm.sharing.config import SharingConfig

MAIN = main_job()  # (8, 1e-5) for the whole run, calibrated on the node


def _request(config: RunConfig = MAIN, data: str = "data-d") -> RunRequest:
    return iadmm_privacy.device_request(config, data)


def _priced() -> RunRequest:
    """A private, covered objpm run of 10 rounds priced (1, 0) without an accountant (no calibration)."""
    return RunRequest("objpm", 10, "c", "d", True, True, lambda: RunCost(1.0, 0.0, "laplace"), "add-remove")


def _policy(directory: Path, **values: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "policy.toml").write_text(Policy(**values).to_toml())  # type: ignore[arg-type]


def test_a_dpiadmm_run_costs_its_ledgers_whole_run_and_release_epsilons() -> None:
    """The device's charge is the statement's own numbers, computed without the ledger's other bounds."""
    cost = _request(dataclasses.replace(MAIN, rounds=7)).cost()
    account = iadmm_privacy.ledger(iadmm_privacy.calibrate(dataclasses.replace(MAIN, rounds=7)))
    assert (cost.epsilon, cost.delta) == (account.whole_run.epsilon_pld, account.whole_run.delta)
    assert cost.release_epsilon == account.per_step.epsilon_pld and 7.9 < cost.epsilon <= 8.0


def test_the_defaults_are_private_and_a_policy_file_is_read_or_refused(tmp_path: Path) -> None:
    assert read_policy(tmp_path) == Policy()
    assert (Policy().max_run_epsilon, Policy().max_run_delta) == (8.0, 1e-5)
    assert not (Policy().allow_non_private or Policy().allow_not_covered or Policy().allow_central_dp)
    _policy(tmp_path, lifetime_epsilon=20.0, algorithms=("objpm",))
    assert read_policy(tmp_path) == Policy(lifetime_epsilon=20.0, algorithms=("objpm",))
    (tmp_path / "policy.toml").write_text("max-run-epsilom = 3\n")
    with pytest.raises(DeviceRefused, match="unknown policy key 'max-run-epsilom'; known keys: max-run-eps"):
        read_policy(tmp_path)
    (tmp_path / "policy.toml").write_text("max-run-epsilon = -1\n")
    with pytest.raises(DeviceRefused, match=r"max-run-epsilon=-1.0 is not allowed; it must be a number >= 0"):
        read_policy(tmp_path)
    assert Policy().neighbouring == "add-remove"  # the main job's
    _policy(tmp_path, neighbouring="replace-one")
    assert read_policy(tmp_path) == Policy(neighbouring="replace-one")
    assert 'neighbouring = "replace-one"' in (tmp_path / "policy.toml").read_text()
    for value in ('"add-or-remove"', "1"):
        (tmp_path / "policy.toml").write_text(f"neighbouring = {value}\n")
        with pytest.raises(DeviceRefused, match=r"neighbouring=.* is not allowed; choose one of add-remove, "
                                                "replace-one"):
            read_policy(tmp_path)


def test_a_missing_policy_is_the_defaults_on_a_new_device_and_refused_on_one_that_answered(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A device that never answered takes the defaults and says so; its first charge writes them to its
    policy file. Once it has answered (a budget file or a secret), a missing policy file is refused, as a
    missing budget file is: it never runs silently looser than its operator set."""
    device = Device(tmp_path, 0)
    assert read_policy(tmp_path) == Policy()
    assert policy_in_force(tmp_path).startswith(
        f"no policy file {tmp_path / 'policy.toml'}: the defaults are in force (one run at most (eps = 8, "
        "delta = 1e-05), all runs (eps = 64, delta = 0.0001)")
    device.admit("a", _request(), charge=False)  # the query: nothing written
    assert list(tmp_path.iterdir()) == [tmp_path / "agent-0.budget.lock"]
    device.admit("a", _request())
    assert (tmp_path / "policy.toml").read_text() == Policy().to_toml()
    assert policy_in_force(tmp_path) == f"the device's policy is {tmp_path / 'policy.toml'}"
    (tmp_path / "policy.toml").unlink()
    missing = (f"the device's policy {tmp_path / 'policy.toml'} is missing but this device has answered "
               "before (agent-0.budget.jsonl exists); it does not fall back to the defaults")
    for refused in (lambda: device.admit("b", _request(), charge=False),
                    lambda: device.admit("a", _request()), lambda: Device(tmp_path, 1).admit("c", _request()),
                    lambda: policy_in_force(tmp_path)):
        with pytest.raises(DeviceRefused, match=re.escape(missing)):
            refused()
    assert main(["node", "status", "--state-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert f"device {tmp_path}: no policy: {missing}" in shown and "write --state-dir" in shown
    assert "agent 0: spent (eps = 7.99" in shown and "over 1 run(s)" in shown
    assert main(["node", "policy", "--state-dir", str(tmp_path)]) == 2
    assert missing in capsys.readouterr().err
    assert main(["node", "policy", "--write", "--state-dir", str(tmp_path)]) == 0
    assert device.admit("a", _request()).run == "a"
    fresh = tmp_path / "secret-only"  # a secret alone is an answer too
    NodeSecret(fresh, 3).secret()
    with pytest.raises(DeviceRefused, match="answered before \\(agent-3.key exists\\)"):
        read_policy(fresh)


def test_the_message_cap_is_a_whole_number_of_bytes(tmp_path: Path) -> None:
    _policy(tmp_path, max_message_bytes=1024)
    assert "max-message-bytes = 1024\n" in (tmp_path / "policy.toml").read_text()
    assert read_policy(tmp_path).max_message_bytes == 1024
    for shown in ("0", "1.5e9", "true", "'big'"):
        (tmp_path / "policy.toml").write_text(f"max-message-bytes = {shown}\n")
        with pytest.raises(DeviceRefused, match=r"max-message-bytes=.* is not allowed; it must be a whole "
                                                r"number of bytes >= 1"):
            read_policy(tmp_path)


@pytest.mark.parametrize(("request_", "reason"), [
    (_request(dataclasses.replace(MAIN, algorithm="iadmm", target_epsilon=0.0)), "releases without noise"),
    (_request(dataclasses.replace(MAIN, target_epsilon=0.0, epsilon=float("inf"))), "releases without noise"),
    (_request(dataclasses.replace(MAIN, target_epsilon=0.0, mechanism="laplace", epsilon=1e6)),
     r"costs \(eps = .*\) for the whole run on this device; its operator allows at most \(eps = 8"),
    (_request(dataclasses.replace(MAIN, target_epsilon=0.0, epsilon=1e6)), "has no guarantee the device's"),
    (_request(papers(sensitivity="data-dependent", epsilon=0.05)), "covered by no guarantee"),
    (sharing_privacy.device_request(SharingConfig(epsilon=float("inf")), "d", 100), "releases without noise"),
    (decentral_privacy.device_request(DecentralConfig(noise="none"), "d", 8), "releases without noise"),
    (decentral_privacy.device_request(DecentralConfig(sensitivity=0.001, samples=100), "d", 8),
     "covered by no guarantee"),
    (linadmm_privacy.device_request(LinAdmmConfig(), "d", 100), "trusts the server to add the noise"),
])
def test_what_a_server_sets_cannot_make_a_device_release_without_its_guarantee(
        tmp_path: Path, request_: RunRequest, reason: str) -> None:
    device = Device(tmp_path, 0)
    with pytest.raises(DeviceRefused, match=reason):
        device.preview(request_)
    with pytest.raises(DeviceRefused, match=reason):
        device.admit(new_run_identity(), request_)
    assert not device.path.exists()  # refused before anything was charged


def test_the_neighbouring_relation_is_the_operators(tmp_path: Path) -> None:
    """Each family states the relation its cost is computed under (DP-IADMM's and DP-ADMM's configured one,
    replace-one for 001 and 004); a run stated for another relation than the policy's is refused before its
    cost is computed, whatever the run config asks."""
    sharing = sharing_privacy.device_request(SharingConfig(epsilon=0.5, rounds=3), "d", 100)
    decentral = decentral_privacy.device_request(DecentralConfig(), "d", 8)
    replaced = _request(dataclasses.replace(MAIN, neighbouring="replace-one", sampling_rate=1.0))
    assert [r.neighbouring for r in (_request(), replaced, sharing, decentral)] == [
        "add-remove", "replace-one", "replace-one", "replace-one"]
    assert [linadmm_privacy.device_request(LinAdmmConfig(neighbouring=n), "d", 100).neighbouring
            for n in ("add-remove", "replace-one")] == ["add-remove", "replace-one"]
    for request_ in (replaced, sharing, decentral):
        expected = (f"algorithm={request_.algorithm!r} as configured states its guarantee for "
                    "neighbouring='replace-one'; this device's operator holds every run to "
                    "neighbouring='add-remove' (the policy key neighbouring)")
        with pytest.raises(DeviceRefused, match=re.escape(expected)):
            Device(tmp_path, 0).admit(new_run_identity(), dataclasses.replace(
                request_, cost=lambda: pytest.fail("the accountant ran for a refused relation")))
    assert not Device(tmp_path, 0).path.exists()
    _policy(tmp_path, neighbouring="replace-one")
    assert Device(tmp_path, 0).admit("sharing", sharing).epsilon > 0
    with pytest.raises(DeviceRefused, match="neighbouring='add-remove'; this device's operator holds every "
                                            "run to neighbouring='replace-one'"):
        Device(tmp_path, 0).preview(_request())


def test_the_operator_may_allow_central_dp_and_a_non_private_run_ends_the_budget(tmp_path: Path) -> None:
    _policy(tmp_path, allow_central_dp=True, allow_non_private=True)
    device = Device(tmp_path, 0)
    central = LinAdmmConfig(target_epsilon=1.0, delta=1e-5)
    device.admit("central", linadmm_privacy.device_request(central, "d", 3000))
    device.admit("plain", _request(dataclasses.replace(MAIN, algorithm="iadmm", target_epsilon=0.0)))
    with pytest.raises(DeviceRefused, match="lifetime budget would be crossed: it has spent \\(eps = inf"):
        device.admit("after", _request())


def test_new_run_identities_cannot_average_the_noise_away(tmp_path: Path) -> None:
    """The 400-identity attack: each identity is a new run, charged in full; the ninth main job is refused."""
    device = Device(tmp_path, 0)
    for _ in range(8):
        charge = device.admit(new_run_identity(), _request())
        assert charge.epsilon == pytest.approx(8.0, rel=1e-3)
    with pytest.raises(DeviceRefused, match=r"lifetime budget would be crossed: it has spent \(eps = 63.9"):
        device.admit(new_run_identity(), _request())
    assert len(Device(tmp_path, 0).charges()) == 8  # read again, as after a restart


def test_the_least_noise_and_a_budget_per_period_are_the_operators(tmp_path: Path) -> None:
    """max-release-epsilon refuses a run whose one step is noisier in epsilon than allowed, whatever its
    total; period-days caps the runs admitted in the last days, beside the lifetime budget."""
    one_step = dataclasses.replace(MAIN, rounds=1, local_steps=1)  # (8, 1e-5) spent in a single release
    _policy(tmp_path, max_release_epsilon=2.0)
    with pytest.raises(DeviceRefused, match=r"adds noise of eps = 8.* per release; this device's operator "
                                            r"wants at least the noise of eps = 2 per release"):
        Device(tmp_path, 0).preview(_request(one_step))
    assert Device(tmp_path, 0).preview(_request()).release_epsilon < 2.0  # the main job's steps: about 1.2
    _policy(tmp_path, period_days=1.0, period_epsilon=10.0)
    Device(tmp_path, 0).admit("today", _request())
    with pytest.raises(DeviceRefused, match=r"the device's budget of 1 day\(s\) would be crossed: with this "
                                            r"run, the runs admitted since .* cost \(eps = 15.99"):
        Device(tmp_path, 0).admit("again", _request())
    record = json.loads(Device(tmp_path, 0).path.read_text())
    Device(tmp_path, 0).path.write_text(json.dumps({**record, "at": "2026-01-01T00:00:00+00:00"}) + "\n")
    Device(tmp_path, 0).admit("again", _request())  # the first run's day is over; the lifetime still counts
    assert len(Device(tmp_path, 0).charges()) == 2


def test_one_identity_is_one_run_on_one_data_set_for_its_rounds(tmp_path: Path) -> None:
    device = Device(tmp_path, 0)
    run = new_run_identity()
    first = device.admit(run, _request())
    again = device.admit(run, _request())  # an exact repeat costs nothing more
    assert again == first and len(device.charges()) == 1
    assert first.settings["epsilon"] == pytest.approx(iadmm_privacy.calibrate(MAIN).epsilon)
    with pytest.raises(DeviceRefused, match="admitted with another configuration"):
        device.admit(run, _request(dataclasses.replace(MAIN, clip_norm=2.0)))
    with pytest.raises(DeviceRefused, match="admitted on other data; this device's data changed"):
        device.admit(run, _request(data="data-d-prime"))
    Device.check_round(first, MAIN.rounds)
    for round_ in (0, MAIN.rounds + 1, 1_000_000):
        with pytest.raises(DeviceRefused, match=f"round {round_} is not allowed; .* rounds 1..{MAIN.rounds}"):
            Device.check_round(first, round_)


@pytest.mark.parametrize(("identity", "rule"), [
    ("", "the server sent no run identity"),
    ("a" * 65, "run identity is 65 characters long; this device accepts at most 64"),
    ("a" * 2**20, "run identity is 1048576 characters long; this device accepts at most 64"),
    ("run\x1b[2J", r"run identity \(7 characters\) holds characters other than 0-9, A-Z, a-z"),
    ("run\nforged", r"run identity \(10 characters\) holds characters other than"),
    ("../agent-1", "holds characters other than"),
    ("r\u00e9sum\u00e9", "holds characters other than"),
])
def test_a_run_identity_the_device_would_not_store_is_refused_before_anything_is_written(
        tmp_path: Path, identity: str, rule: str) -> None:
    """100 identities of 1 MB made a 100 MiB budget, and an ESC or a newline in one reached `node status`:
    admission, the secret and the record of answers refuse it by one rule, naming its length, not its
    value."""
    device, keeper = Device(tmp_path, 0), NodeSecret(tmp_path, 0)
    request = _priced()
    for call in (lambda: device.admit(identity, request), lambda: keeper.randomness(identity),
                 lambda: keeper.answer(identity, 1, "0" * 64)):
        with pytest.raises(DeviceRefused, match=rule) as refused:
            call()
        assert len(str(refused.value)) < 200 and str(refused.value).isprintable()
    assert not device.path.exists() and not keeper.key_path.exists() and not keeper.record_path.exists()
    longest = "Az09_.-" * 9 + "x"  # 64 characters, every kind allowed
    assert device.admit(longest, request).run == longest and keeper.randomness(longest).keys[0]


def test_node_status_prints_nothing_raw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A budget file written before identities were checked (or edited by hand) holds an ESC and a newline
    in a run identity, an algorithm and a mechanism: the status shows them escaped, each charge on its one
    line."""
    device = Device(tmp_path, 0)
    device.admit("plain", _priced())
    record = json.loads(device.path.read_text())
    forged = {**record, "run": "r\x1b[2J\nrun forged: objpm", "algorithm": "objpm\x1b]0;x\x07",
              "mechanism": "gauss\u202eian"}
    device.path.write_text(device.path.read_text() + json.dumps(forged) + "\n")
    (tmp_path / "agent-0.answered.jsonl").write_text(json.dumps({"run": forged["run"], "round": 1,
                                                                 "request": "0" * 64}) + "\n")
    assert main(["node", "status", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(line.isprintable() for line in out.splitlines())
    assert ("  run r\\x1b[2J\\nrun forged: objpm: objpm\\x1b]0;x\\x07, gauss\\u202eian, (eps = 1,"
            in out)
    assert "for 10 rounds, 1 answered" in out and "  run plain: objpm, laplace" in out
    device.path.write_text(json.dumps({**record, "x\x1b": 1}) + "\n")  # a damaged file: its error escaped
    with pytest.raises(DeviceRefused, match=r"damaged at line 1 \(.*'x\\x1b'\)") as refused:
        status(tmp_path)
    assert str(refused.value).isprintable()


def test_a_missing_or_damaged_budget_fails_closed(tmp_path: Path) -> None:
    device = Device(tmp_path, 0)
    device.admit("a", _request())
    NodeSecret(tmp_path, 0).secret()
    text = device.path.read_text()
    device.path.write_text(text + '{"run": "b", "epsi')  # a write cut short by a crash: not a charge
    assert list(device.charges()) == ["a"]
    device.path.write_text('{"run": "b", "epsi\n' + text)
    with pytest.raises(DeviceRefused, match="is damaged at line 1"):
        device.admit("c", _request())
    device.path.unlink()
    with pytest.raises(DeviceRefused, match="is missing but agent 0 has answered before"):
        device.admit("c", _request())
    with pytest.raises(DeviceRefused, match="is missing"):
        status(tmp_path)


def _agent(scale: float) -> AgentData:
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(20, 784, generator=generator) * scale
    y = torch.arange(20) % 10
    return AgentData.from_blocks([x], [y], num_classes=10, total=200, agents=[3], dtype=torch.float32)


def _train_message(run: str, round_: int) -> Message:
    zeros = {role: {"weight": torch.zeros(784, 10)} for role in wire.DOWN}
    content = RecordDict({"arrays": ArrayRecord(wire.pack(zeros)),
                          "config": ConfigRecord({"partition-id": 3, "server-round": round_,
                                                  wire.IDENTITY_KEY: run})})
    return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


@pytest.mark.usefixtures("server_process")
def test_a_deployed_agent_charges_its_device_and_refuses_alike_for_neighbouring_data(tmp_path: Path) -> None:
    """train_reply on a deployed node: the main job is charged once per run (calibrated once), round 11 of a
    10-round run is refused, and a refusal's text is the same for D and D' (one sample scaled)."""
    node = {"randomness": "deployment", "state-dir": str(tmp_path / "state")}
    config = dataclasses.replace(MAIN, num_agents=10)
    run = new_run_identity()
    for round_ in (1, 2):
        reply = train_reply(_train_message(run, round_), config, _agent(1.0), 3, node_config=node)
        assert reply.content["config"][wire.KIND_KEY] == "deployment"
    charges = Device(tmp_path / "state", 3).charges()
    assert list(charges) == [run] and charges[run].epsilon == pytest.approx(8.0, rel=1e-3)
    with pytest.raises(DeviceRefused, match="round 11 is not allowed"):
        train_reply(_train_message(run, 11), config, _agent(1.0), 3, node_config=node)
    greedy = dataclasses.replace(config, target_epsilon=0.0, mechanism="laplace", epsilon=1e8)
    texts = []
    for scale in (1.0, 1.5):
        with pytest.raises(DeviceRefused) as refused:
            train_reply(_train_message(new_run_identity(), 1), greedy, _agent(scale), 3,
                        node_config=node)
        texts.append(str(refused.value).replace(str(refused.value).split(" ")[0], ""))
    assert texts[0] == texts[1] and "0.00" not in texts[0]
    budget = (tmp_path / "state" / f"agent-3{BUDGET_SUFFIX}").read_text().splitlines()
    assert len(budget) == 1 and json.loads(budget[0])["rounds"] == 10


def test_admission_and_status_read_a_long_history_in_under_a_second(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """10^5 past releases: 10^4 runs of 10 rounds each."""
    _policy(tmp_path, lifetime_epsilon=1e9, lifetime_delta=1.0)
    device = Device(tmp_path, 0)
    device.admit("first", _request())
    record = json.loads(device.path.read_text())
    runs = [f"run-{i}" for i in range(10_000)]
    device.path.write_text("".join(json.dumps({**record, "run": run}) + "\n" for run in runs))
    (tmp_path / "agent-0.answered.jsonl").write_text("".join(
        json.dumps({"run": run, "round": t, "request": "0" * 64}) + "\n"
        for run in runs for t in range(1, 11)))
    request = _priced()
    # The command's one-time imports first, on a device with no history (they are the process's start, not
    # the reading of the history: about 0.25 s of CPU, which took the timed call past 1 s under load).
    (tmp_path / "fresh").mkdir()
    _policy(tmp_path / "fresh", lifetime_epsilon=1e9, lifetime_delta=1.0)
    Device(tmp_path / "fresh", 0).admit("first", _request())
    assert main(["node", "status", "--state-dir", str(tmp_path / "fresh")]) == 0
    capsys.readouterr()
    # CPU time, which other processes on the machine stretch less than the clock: 0.3 s for the status
    # idle, but up to 1.1 s with 4 workers on 2 cores. So the status is held to 1 s, or, on a machine that
    # slow, to 4 times its floor measured beside it: reading and parsing the two files it must read.
    started = time.process_time()
    device.admit("one-more", request)
    admitted = time.process_time() - started
    assert main(["node", "status", "--state-dir", str(tmp_path)]) == 0
    shown = time.process_time() - started - admitted
    started = time.process_time()
    for name in (device.path, tmp_path / "agent-0.answered.jsonl"):  # each file one JSON array: the fastest
        json.loads("[" + ",".join(name.read_text().splitlines()) + "]")
    floor = time.process_time() - started
    assert admitted < 1.0 and shown < max(1.0, 4 * floor), (admitted, shown, floor)
    out = capsys.readouterr().out
    assert f"agent 0: spent (eps = {10_000 * record['epsilon'] + 1:.6g}, delta = 0.1)" in out
    assert "over 10001 run(s)" in out
    assert "run run-9999: objpm, gaussian, (eps = 7.99" in out and "for 10 rounds, 10 answered" in out


def test_the_node_commands_name_a_missing_state_folder_and_an_unknown_algorithm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --state-dir read as a device that spent nothing, and a policy naming an algorithm no family
    runs (the device would then refuse every run) was shown as valid."""
    assert main(["node", "status", "--state-dir", str(tmp_path / "typo")]) == 0
    assert f"({tmp_path / 'typo'} does not exist yet: check the path" in capsys.readouterr().out
    _policy(tmp_path, algorithms=("ldp-admn",))
    assert main(["node", "policy", "--state-dir", str(tmp_path)]) == 2
    assert "algorithms names 'ldp-admn', which no family runs; choose among iadmm" in capsys.readouterr().err
