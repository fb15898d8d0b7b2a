"""The app's own network: nothing in dpadmm knows it, which is the point of the example.

DP-IADMM clips every sample's gradient, so the network must treat samples independently:
no BatchNorm or other buffers (dpadmm refuses modules with buffers). Inputs are flattened
28 x 28 images, as this example's data hold them.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyCNN(nn.Module):
    """conv 5x5 (stride 2) -> ReLU -> max-pool 2 -> dense: about 2,000 parameters with 4 channels.

    Small on purpose: the noise of the objective perturbation is added to every parameter, so
    fewer parameters mean less noise in total, and per-sample gradients stay cheap on a CPU.
    """

    def __init__(self, channels: int = 4, num_classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(1, channels, kernel_size=5, stride=2, padding=2)  # 28 x 28 -> 14 x 14
        self.fc = nn.Linear(channels * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1, 28, 28)
        x = nn.functional.max_pool2d(nn.functional.relu(self.conv(x)), 2)  # 14 x 14 -> 7 x 7
        return self.fc(x.flatten(1))
