"""strategies.nodes: the checks every strategy's constructor shares (a plug-in strategy gets its arguments
from another app's code)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
import torch

from dpadmm.iadmm.config import RunConfig
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.sharing.config import SharingConfig
from strategies import DPIADMM
from strategies.linadmm import DPLinADMM
from strategies.sharing import ADMMSharing

ONES = torch.ones(4, dtype=torch.float64)
EYE = torch.eye(5, dtype=torch.float64)


@pytest.mark.parametrize(("build", "error", "message"), [
    # 0/1 labels made every label-0 sample's loss constant: class 0 silently ignored
    (lambda: ADMMSharing(SharingConfig(epsilon=math.inf), torch.tensor([1.0, 0.0]), ONES, "ids"), ValueError,
     "labels[1] is 0.0; allowed: -1 or +1 (2 y - 1 for labels 0 and 1)"),
    (lambda: ADMMSharing(SharingConfig(epsilon=math.inf), ONES, torch.tensor([]), "ids"), ValueError,
     "test_labels has shape (0,); give a non-empty 1-D tensor"),
    (lambda: ADMMSharing({"parties": "66,57"}, ONES, ONES, "ids"), TypeError,
     "config is a dict; give a dpadmm.sharing.config.SharingConfig"),
    (lambda: DPLinADMM(LinAdmmConfig(), EYE, 0), ValueError, "num_samples=0 is not allowed"),
    (lambda: DPLinADMM(LinAdmmConfig(), EYE, 2.5), TypeError, "num_samples is a float; give the clients'"),
    (lambda: DPLinADMM(LinAdmmConfig(), EYE * math.nan, 5), ValueError, "a[0, 0] is nan; allowed: finite"),
    (lambda: DPLinADMM(LinAdmmConfig(), ONES, 5), ValueError, "a has shape (4,); give a non-empty 2-D"),
    (lambda: DPIADMM(RunConfig(), {"weight": torch.full((3, 2), math.inf)}), ValueError,
     "parameters['weight'][0, 0] is inf; allowed: finite numbers"),
])
def test_a_strategy_refuses_arguments_no_round_could_use(build: Callable[[], object], error: type,
                                                          message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        build()
