"""ServerApp: the run config's ``method`` chooses which strategy trains the task."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from digits_app import dpfedavg, dpiadmm, dpsgd
from digits_app.task import settings

app = ServerApp()
SERVERS = {"dpiadmm": dpiadmm.serve, "dp-fedavg": dpfedavg.serve, "dp-sgd": dpsgd.serve}


@app.main()
def main(grid: Grid, context: Context) -> None:
    _, own = settings(context.run_config)
    SERVERS[own.method](grid, context)
