"""FedAvg with dpadmm's payload: the reference runs of ``python -m benchmarks.flower_overhead``."""
