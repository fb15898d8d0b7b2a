"""Flower strategies (server side) of the DP-IADMM family, usable as plug-ins by any Flower app.

``DPIADMM`` is a ``flwr.serverapp.strategy.Strategy`` (Message API). It performs line 5
(the global model w, eq. (4a)) and line 8 (the duals lambda_p, eq. (4c)) of Algorithm 1
in 003 with the core functions of ``dpadmm.consensus``, and keeps the per-agent state
(z_p, lambda_p) keyed by the partition id each client reports (node ids are random).

Protocol (what a ClientApp must speak; ``clients.client_app`` does):

* train message to every node: ``arrays["w"]`` (the model the round uses: w^{t+1}, or
  w^t for OutP) and ``config["server-round"] = t``;
* reply: ``arrays["z"]`` (z_p^{t+1}) and ``metrics`` with ``partition-id``,
  ``noise-magnitude``, ``dual-sum`` and ``dual-l1`` (a checksum of the client's lambda_p that the
  strategy compares with its own copy).
"""

from strategies.dpiadmm import DPIADMM

__all__ = ["DPIADMM"]
