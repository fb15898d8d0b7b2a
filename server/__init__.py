"""The ServerApp of every family: ``server.server_app:app`` (the family's strategy, central evaluation, the
run's folder)."""
