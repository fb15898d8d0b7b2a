"""The app's run config: dpadmm's RunConfig plus this app's own keys.

``RunConfig.from_mapping`` rejects keys it does not know (a typo must not silently fall back
to a default), so the app takes its own keys out first. Both the ServerApp and the
ClientApp read the run config through :func:`settings`, so they build the same network
and, when ``target-epsilon`` is set, the same calibrated eps-bar.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dpadmm.iadmm import privacy
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
    """(dpadmm's RunConfig, calibrated when it sets target-epsilon; this app's settings)."""
    return _settings(tuple(sorted(run_config.items())))


@lru_cache(maxsize=8)
def _settings(items: tuple[tuple[str, Any], ...]) -> tuple[RunConfig, AppSettings]:
    # Cached per process: calibrating eps-bar to a target-epsilon takes seconds, and a Flower
    # worker process answers many train messages.
    values = dict(items)
    own = AppSettings(conv_channels=int(values.get("conv-channels", AppSettings.conv_channels)))
    config = RunConfig.from_mapping({k: v for k, v in values.items() if k not in APP_KEYS})
    return privacy.calibrate(config), own
