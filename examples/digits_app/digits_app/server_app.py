"""ServerApp: the run config's ``method`` chooses which strategy trains the task."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from digits_app import dpfedavg, dpiadmm
from digits_app.task import settings

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    _, own = settings(context.run_config)
    (dpiadmm if own.method == "dpiadmm" else dpfedavg).serve(grid, context)
