"""One task, two private strategies: dpadmm's DP-IADMM beside Flower's DP-FedAvg (an example app)."""
