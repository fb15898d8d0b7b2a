"""RunConfig: the Flower run config and the CLI share its keys and defaults; bad input is named."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib

import pytest

from dpadmm.iadmm.config import RunConfig, from_app_config, main_job, papers, preset_values, requested
from dpadmm.iadmm.privacy import calibrate
from tests.conftest import ROOT


def test_pyproject_holds_one_table_per_preset_every_key_written_out() -> None:
    app_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert {k: v for k, v in app_config.items() if not isinstance(v, dict)} == {"algorithm": "objpm",
                                                                               "preset": "main"}
    for preset, table in (("main", "iadmm"), ("papers", "iadmm-papers")):
        assert {"algorithm": "objpm", **app_config[table]} == preset_values(preset)
        assert from_app_config(app_config[table], preset) == requested({}, preset)
    assert requested({}) == main_job() == RunConfig() and requested({}, "papers") == papers()
    assert main_job().target_epsilon == 8.0 and main_job().sampling_rate < 1


def test_a_given_value_is_never_replaced_by_a_preset() -> None:
    """The preset fills the keys left out, and only those: a value given equal to a default of the other
    preset stays, and neither `epsilon` nor `algorithm` switches the preset."""
    assert requested({"rounds": 3}) == dataclasses.replace(main_job(), rounds=3)
    assert requested({"rounds": 50}, "papers") == papers()  # equal to the papers' value: the same run
    assert requested({"rounds": 10}, "papers").rounds == 10  # the main job's value, given under papers
    assert requested({"algorithm": "objt"}) == dataclasses.replace(main_job(), algorithm="objt")
    assert requested({"epsilon": 0.5, "target-epsilon": 0}) == dataclasses.replace(
        main_job(), epsilon=0.5, target_epsilon=0.0)
    assert requested({"epsilon": 0.5}, "papers") == papers(epsilon=0.5)
    main = main_job().to_mapping()
    assert from_app_config({**main, "seed": 4}) == dataclasses.replace(main_job(), seed=4)
    assert from_app_config({**papers().to_mapping(), "rounds": 3}, "papers") == papers(rounds=3)


@pytest.mark.parametrize(("given", "preset", "message"), [
    ({"epsilon": 0.5}, "main", "epsilon=0.5 is not used while target-epsilon=8 calibrates eps-bar for the "
                               "whole run (to 0.692527); give target-epsilon=0 with it, or leave epsilon out "
                               "(the main preset sets target-epsilon; give it, or use the papers preset)"),
    ({"target-epsilon": 0}, "main", "epsilon=0 is not allowed with target-epsilon=0: give eps-bar per "
                                    "local step (> 0, inf = non-private) or a whole-run target-epsilon to "
                                    "calibrate it (the main preset sets epsilon; give it, or use the papers "
                                    "preset)"),
    ({"epsilon": -1}, "main", "epsilon=-1.0 is not allowed; it must be > 0"),  # the value's own error first
    ({"algorithm": "outp"}, "main", "mechanism='gaussian' is not allowed with algorithm='outp'; it is the "
                                    "objective perturbation with L2-clipped gradients "
                                    "(sensitivity='clipped') (the main preset sets mechanism; give it, or "
                                    "use the papers preset)"),
    ({"algorithm": "iadmm"}, "main", "(the main preset sets target-epsilon; give it"),
    ({"epochs": 3}, "main", "unknown configuration key 'epochs'; known keys: algorithm, batch-size"),
    ({}, "paper", "preset='paper' is not allowed; choose one of main, papers"),
])
def test_what_a_preset_cannot_run_is_refused_with_where_the_value_came_from(
        given: dict[str, object], preset: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        requested(given, preset)


def test_from_mapping_coerces_what_toml_and_flwr_give() -> None:
    config = RunConfig.from_mapping({"epsilon": "inf", "target-epsilon": 0, "rounds": 3.0,
                                     "save-weights": "true", "beta": 0})
    assert math.isinf(config.epsilon) and config.rounds == 3 and config.save_weights and config.beta == 0.0
    assert not config.private and config.effective_epsilon == math.inf


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"algorithm": "admm"}, "algorithm='admm' is not allowed; choose one of iadmm, objp"),
        ({"epsilon": 0}, "epsilon=0 is not allowed with target-epsilon=0"),
        ({"epsilon": "nan"}, "epsilon=nan"),
        ({"rounds": 0}, "rounds=0 is not allowed"),
        ({"rounds": 2.5}, "rounds=2.5 is not allowed; expected an integer"),
        ({"algorithm": "objp", "local-steps": 3}, "local-steps=3 is not allowed with algorithm='objp'"),
        ({"seed": -1}, "seed=-1 is not allowed"),
        ({"device": "tpu"}, "device='tpu' is not allowed"),
        ({"dataset": "cifar"}, "dataset='cifar' is not allowed"),
        # a folder the embedded sample would not read: refused, never recorded in config.json and ignored
        ({"data-dir": "/data/mnist"}, "data-dir='/data/mnist' is not read by dataset='default' (the embedded "
                                      "5,000-image MNIST sample); give dataset='mnist'"),
        ({"outp-delta": 1.0}, "outp-delta=1.0 is not allowed"),
        ({"epochs": 3}, "unknown configuration key 'epochs'"),
    ],
)
def test_bad_values_are_named(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.from_mapping({**papers().to_mapping(), **values})


def test_derived_values() -> None:
    assert papers(algorithm="objpm").steps == 10
    assert papers(algorithm="objpm", local_steps=2).steps == 2
    assert papers(algorithm="objt").steps == 1
    assert papers(algorithm="iadmm", epsilon=0.1).effective_epsilon == math.inf
    assert papers(dataset="mnist").rho_constants == (2.0, 5.0, 10000)
    assert papers(rho_preset="femnist").rho_constants == (0.005, 0.05, 2000)
    assert papers(rho_preset="custom", rho_c1=1.0, rho_c2=0.0, rho_tc=5).rho_constants == (1.0, 0.0, 5)
    assert {f.name for f in dataclasses.fields(RunConfig)} >= {"algorithm", "epsilon", "local_steps"}


def test_the_main_jobs_largest_step_follows_a_rule() -> None:
    """prox-scale 0 and rho-preset main: logistic regression's largest step is a = 13 P / C with rho = 0.005 /
    a (the main job's a = 130 and rho = 3.8e-5 with its 10 agents at C = 1), a rate of 13 / (1.005 C) at t =
    1 whatever P and C; a network's is a = 4 (1 + 0.02) P / C with rho = 0.02 / a, so that its agents take
    DP-SGD steps of rate 4 / C on their mean loss at t = 1, whatever P and C (the noise may shrink either:
    tests/test_schedules.py); a given prox-scale is used as given."""
    logistic = main_job()
    assert (logistic.scale, logistic.rho_constants) == (130.0, (pytest.approx(0.005 / 130), 0.0, 10000))
    for agents, clip in ((10, 1.0), (5, 3.0), (195, 1.0)):
        many = dataclasses.replace(main_job(), num_agents=agents, clip_norm=clip)
        assert many.scale == pytest.approx(13.0 * agents / clip)
        assert many.rho_constants == (pytest.approx(0.005 / many.scale), 0.0, 10000)
        rate = many.scale / (1 + many.scale * many.rho_constants[0]) / agents  # eta^1 (I_p / I)
        assert rate * clip == pytest.approx(13.0 / 1.005)
        network = dataclasses.replace(main_job(), model="mlp", num_agents=agents, clip_norm=clip)
        assert network.scale == pytest.approx(4.08 * agents / clip)
        assert network.rho_constants == (pytest.approx(0.02 / network.scale), 0.0, 10000)
        rate = network.scale / (1 + network.scale * network.rho_constants[0]) / agents  # eta^1 (I_p / I)
        assert rate * clip == pytest.approx(4.0)
    assert dataclasses.replace(main_job(), model="mlp", prox_scale=7.0).scale == 7.0
    with pytest.raises(ValueError, match="prox-scale=-1.0 is not allowed"):
        RunConfig(prox_scale=-1.0)


def test_a_network_under_the_main_jobs_rule_clips_without_noise_too() -> None:
    """Its rate is in units of 1 / C: a network under the rule clips whether or not the run is private;
    logistic regression and a given prox-scale clip only where a private run's sensitivity needs it."""
    quiet = {"epsilon": math.inf, "target_epsilon": 0.0}
    for model in ("mlp", "small-cnn", "custom"):
        assert RunConfig(model=model).clipped and RunConfig(model=model, **quiet).clipped
        assert RunConfig(model=model, **quiet).network_rule
        assert not RunConfig(model=model, prox_scale=7.0, **quiet).clipped
        iadmm = RunConfig(model=model, algorithm="iadmm", target_epsilon=0.0)
        assert iadmm.clipped and not iadmm.private
    assert main_job().clipped and not RunConfig(**quiet).clipped and not RunConfig(**quiet).network_rule



@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mechanism": "gaussian", "algorithm": "outp"},
         "mechanism='gaussian' is not allowed with algorithm='outp'; it is the objective perturbation"),
        ({"mechanism": "gaussian", "sensitivity": "data-dependent"},
         "mechanism='gaussian' is not allowed with sensitivity='data-dependent'"),
        ({"mechanism": "uniform"}, "mechanism='uniform' is not allowed; choose one of laplace, gaussian"),
        ({"sampling-rate": 0}, "sampling-rate=0.0 is not allowed; it must be in (0, 1]"),
        ({"sampling-rate": 1.5}, "sampling-rate=1.5 is not allowed; it must be in (0, 1]"),
        ({"sampling-rate": 0.1}, "sampling-rate=0.1 is not allowed with neighbouring='replace-one'"),
        ({"sampling-rate": 0.1, "neighbouring": "add-remove", "algorithm": "outp"},
         "sampling-rate=0.1 is not allowed with algorithm='outp'"),
        ({"sampling-rate": 0.1, "neighbouring": "add-remove", "sensitivity": "data-dependent"},
         "sampling-rate=0.1 is not allowed with sensitivity='data-dependent'"),
        ({"sampling-rate": 0.1, "neighbouring": "add-remove", "model": "mlp", "batch-size": 8},
         "sampling-rate=0.1 is not allowed with batch-size=8"),
        ({"batch-size": 16}, "batch-size=16 is not allowed with model='logistic', whose closed-form"),
        ({"batch-size": -1, "model": "mlp"}, "batch-size=-1 is not allowed; it must be >= 0"),
        ({"model": "resnet"},
         "model='resnet' is not allowed; choose one of logistic, cnn, small-cnn, scatter-cnn, mlp, custom"),
        ({"model": "mlp", "algorithm": "outp"}, "algorithm='outp' is not allowed with model='mlp'"),
        ({"model": "cnn", "sensitivity": "data-dependent"},
         "sensitivity='data-dependent' is not allowed with model='cnn': eq. (9b)"),
        ({"model": "custom", "algorithm": "outp"}, "algorithm='outp' is not allowed with model='custom'"),
        ({"model": "mlp", "neighbouring": "add-remove", "batch-size": 8},
         "batch-size=8 is not allowed with neighbouring='add-remove'"),
        ({"per-sample": "loop"}, "per-sample='loop' is not allowed; choose one of auto, vmap, factorized"),
        ({"per-sample": "factorized"}, "per-sample='factorized' is not allowed with model='logistic'"),
        ({"noise-generator": "numpy"}, "noise-generator='numpy' is not allowed; choose one of philox, torch"),
        ({"trust-radius": "constant"},
         "trust-radius='constant' is not allowed; choose one of paper, reference"),
        ({"noise-room": -1.0, "prox-scale": 0.0},
         "noise-room=-1.0 is not allowed; it must be finite and >= 0"),
        ({"noise-room": 5.0},
         "noise-room=5.0 is not read with a given prox-scale, only with prox-scale=0; leave it at its"),
        ({"trust-radius": "reference", "algorithm": "objpm"},
         "trust-radius='reference' is not allowed with algorithm='objpm': the trust radius is objt's"),
    ],
)
def test_bad_model_mechanism_and_batch_combinations_are_named(values: dict, message: str) -> None:
    """The combinations the theory does not cover (a network with OutP or eq. (9b), Gaussian noise without
    L2 clipping, a minibatch scale that is not public) are refused where the values enter."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.from_mapping({**papers().to_mapping(), **values})


@pytest.mark.parametrize("values", [
    {"model": "mlp", "batch-size": 16},
    {"model": "cnn", "mechanism": "gaussian", "batch-size": 8, "algorithm": "objt"},
    {"model": "mlp", "neighbouring": "add-remove"},
    {"model": "custom", "algorithm": "iadmm", "batch-size": 4},
    {"mechanism": "gaussian", "algorithm": "objpm"},
    {"algorithm": "objt", "trust-radius": "reference"},
])
def test_covered_model_combinations_are_accepted(values: dict) -> None:
    config = RunConfig.from_mapping({**papers().to_mapping(), **values})
    assert config.clip_norm_type == ("l2" if values.get("mechanism") == "gaussian" else "l1")
    for key, value in values.items():
        assert config.to_mapping()[key] == value


def test_a_run_folder_is_named_after_the_epsilon_a_user_quotes() -> None:
    """Budget-first: the whole-run (eps, delta), not the calibrated per-step eps-bar; eps-bar given: labelled
    as such; no noise: epsinf."""
    main = main_job()
    assert main.default_out() == "runs/objpm-eps8-delta1e-05-E10-seed0"
    assert calibrate(main).default_out() == main.default_out()  # calibrated: eps-bar 0.692527
    given = papers(algorithm="objpm", epsilon=0.5, local_steps=10, seed=3)
    assert given.default_out() == "runs/objpm-epsbar0.5-E10-seed3"
    assert papers(algorithm="iadmm").default_out() == "runs/iadmm-epsinf-E1-seed0"
