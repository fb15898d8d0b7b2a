"""Flower ClientApp of DP-IADMM (client side): ``clients.client_app:app``."""
