"""Flower strategies (server side), one module per family, usable as plug-ins by any Flower app.

``DPLinADMM`` (``strategies/linadmm.py``) is paper 002's DP-ADMM / DP-AccADMM: each iteration it
sends every client the point x (``arrays["x"]``), each replies ``arrays["gradient-sum"]`` (its
rows' clipped gradient sum, :mod:`clients.linadmm`) with ``metrics`` ``count``,
``partition-id`` and ``server-round``, and the server adds the Gaussian noise once.
``strategies/nodes.py`` keeps which node holds which partition, for both.

``DPIADMM`` is a ``flwr.serverapp.strategy.Strategy`` (Message API). It performs the global update (the
mean of the releases by default, ``server-update=mean``; line 5 of Algorithm 1 in 003, eq. (4a), with
``server-update=admm``) and the duals lambda_p (line 8, eq. (4c)) with the core functions of
``dpadmm.iadmm.consensus``, and keeps the per-agent state (z_p, lambda_p) keyed by the partition id each
client reports (node ids are random). ``ADMMSharing`` (001, ``strategies/sharing.py``) and ``GraphRouter``
(004, ``strategies/decentral.py``) are the other families' strategies.

Protocol (what a ClientApp must speak; ``clients.dpiadmm`` implements it for any model):

* a query message: reply ``metrics["partition-id"]``, the agent this node holds;
* a train message to each sampled agent p: one ``arrays`` record keyed ``<role>.<parameter>``
  (:mod:`dpadmm.wire`) with roles ``w`` (the model the round uses: w^{t+1}, or w^t for OutP),
  ``lambda`` (lambda_p) and ``z`` (its last local iterate), and ``config["server-round"] = t``,
  ``config["partition-id"] = p``;
* reply: ``arrays`` with ``z.<parameter>`` (z_p^{t+1}) and, when z_p^{t+1} is the average of E > 1
  iterates (``release=average``), ``z-last.<parameter>`` (the last), and ``metrics`` with ``partition-id``
  and ``server-round``.
"""

from strategies.dpiadmm import DPIADMM
from strategies.linadmm import DPLinADMM

__all__ = ["DPIADMM", "DPLinADMM"]
