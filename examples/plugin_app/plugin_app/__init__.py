"""A user's Flower app that trains its own network with dpadmm's DP-IADMM strategy (a plug-in example)."""
