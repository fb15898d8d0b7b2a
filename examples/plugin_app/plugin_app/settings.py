"""The app's run config: dpadmm's RunConfig plus this app's own keys.

``RunConfig.from_mapping`` rejects keys it does not know (a typo must not silently fall back
to a default), so the app takes its own keys out first. Both the ServerApp and the
ClientApp read the run config through :func:`settings`, so they build the same network.
Nothing here calibrates eps-bar to ``target-epsilon``: the strategy, every agent
(``train_reply``) and the privacy ledger do it themselves, so no side can skip it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpadmm.iadmm.config import RunConfig
from plugin_app.model import TinyCNN


@dataclass(frozen=True)
class AppSettings:
    """This app's own keys (``[tool.flwr.app.config]`` entries that are not dpadmm's)."""

    conv_channels: int = 4

    def model(self) -> TinyCNN:
        """The network both sides use: the server's initial parameters and the agents' must match."""
        return TinyCNN(channels=self.conv_channels)


APP_KEYS = ("conv-channels",)


def settings(run_config: Mapping[str, Any]) -> tuple[RunConfig, AppSettings]:
    """(dpadmm's RunConfig, this app's settings); a value the network cannot be built with is refused
    before any round, naming it."""
    channels = run_config.get("conv-channels", AppSettings.conv_channels)
    if not isinstance(channels, int) or isinstance(channels, bool) or channels < 1:
        raise ValueError(f"conv-channels={channels!r} is not allowed: give an integer >= 1")
    own = AppSettings(conv_channels=channels)
    return RunConfig.from_mapping({k: v for k, v in run_config.items() if k not in APP_KEYS}), own
