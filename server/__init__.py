"""Flower ServerApp of DP-IADMM: ``server.server_app:app``."""
