"""Flower's DP-FedAvg with client-side fixed clipping, on dpadmm's data and model (a baseline)."""
