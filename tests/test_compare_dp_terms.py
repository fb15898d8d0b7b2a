"""benchmarks.compare_dp_terms: the drift-correction table read from the tuning runs."""

from __future__ import annotations

from typing import Any

from benchmarks.compare_dp_terms import correction_lines


def _tune(method: str, error: float, dataset: str = "mnist100-dir0.1", **params: Any) -> dict[str, Any]:
    return {"dataset": dataset, "method": method, "epsilon": 1.0, "seed": 0, "phase": "tune",
            "params": params, "val-error": error}


def test_each_correction_strength_shows_its_best_step_size() -> None:
    runs = [
        _tune("dpiadmm", 0.20, rho_c1=1e-4, prox_scale=400.0),  # no local_start: the papers' chain
        _tune("dpiadmm", 0.15, rho_c1=1e-4, prox_scale=1600.0),
        _tune("dpiadmm", 0.12, rho_c1=1e-4, prox_scale=400.0, local_start="global"),
        _tune("dpiadmm", 0.30, rho_c1=1e-2, prox_scale=400.0, local_start="global"),
        _tune("dpsgd", 0.18, sample_rate=0.1, lr=4.0),
        _tune("dpsgd", 0.10, sample_rate=0.05, lr=4.0),  # another rate: not FedProx's, not in mu = 0
        _tune("dpsgd", 0.11, sample_rate=0.1, lr=1.0),  # a learning rate FedProx's grid lacks
        _tune("dpfedprox", 0.17, sample_rate=0.1, lr=16.0, prox_mu=0.1),
        _tune("dpfedprox", 0.16, sample_rate=0.1, lr=4.0, prox_mu=0.1),
        {**_tune("dpiadmm", 0.01, rho_c1=1e-4, prox_scale=400.0), "phase": "report"},  # not tuning
        _tune("dpiadmm", 0.01, dataset="mnist", rho_c1=1e-4, prox_scale=400.0),  # not on this axis
    ]
    lines = correction_lines(runs)
    header = next(line for line in lines if line.startswith("| partition"))
    row = next(line for line in lines if line.startswith("| dirichlet:0.1"))
    cells = dict(zip(header.strip("|").split(" | "), row.strip("|").split(" | "), strict=True))
    assert {k.strip(): v.strip() for k, v in cells.items()} == {
        "partition": "dirichlet:0.1", "eps": "1",
        "rho 0.0001, global": "12.00", "rho 0.0001, chain": "15.00",
        "rho 0.001, global": "-", "rho 0.001, chain": "-",
        "rho 0.01, global": "30.00", "rho 0.01, chain": "-",
        "mu 0": "18.00", "mu 0.01": "-", "mu 0.1": "16.00", "mu 1": "-"}
    assert len([line for line in lines if line.startswith("| ") and "partition" not in line
                and "---" not in line]) == 1
    assert correction_lines([r for r in runs if r["dataset"] == "mnist"]) == []
