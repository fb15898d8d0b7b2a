"""The client's side of DP-ADMM / DP-AccADMM (002) on Flower: its rows' clipped gradient sum.

A client holds a contiguous block of the training rows (scaled to unit norm, labels +-1). Each
iteration it receives the point x and answers with sum_i clip_c(g_i(x)) over its rows and its
row count; it adds no noise (the server does, once: central DP) and keeps no state. So it draws nothing
and has no kind of randomness to report: the server decides its own (:func:`strategies.nodes.server_kind`).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.models import binary
from dpadmm.wire import GRADIENT_KEY, POINT_KEY


def gradient_reply(msg: Message, config: LinAdmmConfig, features: torch.Tensor, labels: torch.Tensor,
                   partition_id: int) -> Message:
    """Answer a train message: the clipped gradient sum of this client's rows at the received point."""
    asked = int(msg.content["config"]["partition-id"])
    if asked != partition_id:
        raise ValueError(f"the server asked partition {asked}, but this node holds partition {partition_id}")
    point = torch.from_numpy(np.array(msg.content["arrays"][POINT_KEY].numpy(), copy=True))
    point = point.to(dtype=features.dtype, device=features.device).unsqueeze(0)
    total = binary.clipped_gradient_sum(features, labels, point, config.grad_bound)[0]
    metrics = MetricRecord({"partition-id": partition_id, "count": int(features.shape[0]),
                            "server-round": int(msg.content["config"]["server-round"])})
    arrays = ArrayRecord({GRADIENT_KEY: Array(total.cpu().numpy())})
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
