"""Run outputs a person can open: config.json, privacy.json, metrics.jsonl, optional weights.npz.

Shared by the engine and the Flower ServerApp so both write the same files. Metrics are
appended and flushed round by round, so an interrupted run keeps what it computed; a run that
fails after its folder was made also gets ``failed.json`` (why, and its last recorded round), so that
nobody takes its partial metrics for a result (:func:`failure`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpadmm.data import Dataset
from dpadmm.files import fresh_path, write_atomic
from dpadmm.models.logistic import error_from_logits, error_rate, loss_from_logits, training_loss
from dpadmm.models.modules import Params, logits_of

FAILED = "failed.json"
UNFINISHED = ("not finished: the run is in progress, or its process ended without a word (flwr stop, a "
              "kill); privacy.json states the planned run, of which the recorded rounds spent a part")


def fresh_directory(path: str | Path) -> Path:
    """:func:`fresh_path`, made."""
    candidate = fresh_path(path)
    candidate.mkdir(parents=True, exist_ok=True)
    return candidate


def central_metrics(w: torch.Tensor | Params, dataset: Dataset, beta: float,
                    module: nn.Module | None = None, train: bool = True) -> dict[str, float]:
    """Test error and training objective (eq. (2c)) of the global model w: logistic regression's
    [J, K] tensor, or the parameters of ``module``. ``train=False`` leaves out the training objective,
    which reads the raw training data (a simulation's diagnostic; a deployed server computes none)."""
    if module is None:
        x_test = dataset.x_test.to(device=w.device, dtype=w.dtype)
        out = {"test-error": error_rate(x_test, dataset.y_test.to(w.device), w)}
        if train:
            x_train = dataset.x_train.to(device=w.device, dtype=w.dtype)
            out["train-loss"] = training_loss(x_train, dataset.y_train.to(w.device), w, beta)
        return out
    first = next(iter(w.values()))
    with torch.no_grad():
        test = logits_of(module, w, dataset.x_test.to(device=first.device, dtype=first.dtype))
        out = {"test-error": error_from_logits(test, dataset.y_test.to(first.device))}
        if train:
            logits = logits_of(module, w, dataset.x_train.to(device=first.device, dtype=first.dtype))
            squared = float(sum((p * p).sum() for p in w.values()))
            out["train-loss"] = loss_from_logits(logits, dataset.y_train.to(first.device), squared, beta)
    return out


def json_value(value: Any) -> Any:
    """JSON has no infinity: inf and -inf are written as the strings "inf" and "-inf"."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


class RunWriter:
    """Writes one run's folder: config.json at the start, a metrics line per evaluation.

    ``settings`` is the run's configuration as a plain mapping (any family's keys), written
    to config.json with the ``engine`` that ran it. With ``fresh`` the folder is
    ``directory`` if it holds no metrics yet, else ``directory_1``, ... (:func:`fresh_directory`),
    so that no earlier run is overwritten. A caller that owns its folders (the engine's
    checkpointed runs, a resumed Flower server) passes ``fresh=False``: the folder is used as
    is, its logs restarted, or with ``resume_round`` kept up to that round (the metrics kept
    are in :attr:`kept`) and appended to. The Flower server also writes ``rounds.jsonl``, one
    operator report per round, and with ``run_identity`` (the identity it drew for the run and sent to the
    nodes) records it in config.json as ``run-identity``: the name under which each deployed device's
    ``dpadmm node status`` lists the run.
    """

    def __init__(self, settings: Mapping[str, Any], *, engine: str, directory: str | Path,
                 fresh: bool = False, save_weights: bool = False, resume_round: int | None = None,
                 run_identity: str = "") -> None:
        if resume_round is not None and fresh:
            raise ValueError("resume_round needs the directory of the run to resume, not a fresh one")
        if resume_round is not None and save_weights:
            raise ValueError("save-weights cannot be resumed: weights.npz is written when a run ends")
        if fresh:
            self.directory = fresh_directory(directory)
        else:
            self.directory = Path(directory)
            self.directory.mkdir(parents=True, exist_ok=True)
        self.save_weights = save_weights
        self._weights: dict[str, np.ndarray] = {}
        header = {key: json_value(v) for key, v in settings.items()}
        header["engine"] = engine
        if run_identity:
            header["run-identity"] = run_identity
        (self.directory / "config.json").write_text(json.dumps(header, indent=2) + "\n")
        self.last_round: int | None = resume_round
        # Rounds finished (evaluated or not), set by the engine's loop; with ``spent`` (the ledger of the
        # first k rounds), a run that stops early rewrites privacy.json with what it spent.
        self.completed = resume_round or 0
        self.spent: Callable[[int], Any] | None = None
        self.ledger: Any = None  # the statement last written to privacy.json
        self._resume_round = resume_round
        self._metrics, self.kept = self._open_log("metrics.jsonl")
        self._rounds: Any = None
        self._mark_unfinished()

    def _mark_unfinished(self) -> None:
        """failed.json while the run goes, replaced when it ends (removed, or the error's): a run whose
        process ends without a word (``flwr stop``, a kill, a lost machine) leaves its folder marked
        unfinished, not read as a finished run, with the rounds it recorded."""
        unfinished = {"reason": UNFINISHED, "error": None, "last-round": self.last_round,
                      "completed-rounds": max(self.completed, self.last_round or 0)}
        write_atomic(self.directory / FAILED, json.dumps(unfinished, indent=2) + "\n")

    def _open_log(self, name: str) -> tuple[Any, list[dict[str, Any]]]:
        """Open a JSON-lines log for appending, with the records kept: those up to the resumed
        round when resuming, else none (an earlier file in a caller's folder is replaced)."""
        path = self.directory / name
        kept: list[dict[str, Any]] = []
        if self._resume_round is not None:
            if path.exists():
                kept = [r for r in read_jsonl(path) if r["round"] <= self._resume_round]
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
        else:
            path.unlink(missing_ok=True)
        return open(path, "a", encoding="utf-8"), kept  # noqa: SIM115

    def write_ledger(self, ledger: Any) -> None:
        """privacy.json: the run's privacy statement (a :class:`~dpadmm.privacy.ledger.Ledger`, or a family's
        own with ``to_dict`` and ``randomness``), written before training starts and again as the run learns
        more."""
        self.ledger = ledger
        data = {key: json_value(v) for key, v in ledger.to_dict().items()}
        (self.directory / "privacy.json").write_text(json.dumps(data, indent=2, default=json_value) + "\n")

    def record(self, metrics: dict[str, Any], w: torch.Tensor | Params | None = None) -> None:
        """Append one evaluated round (and keep w for weights.npz if asked: key ``round-<t>``, or
        ``round-<t>.<parameter name>`` for a module's parameters)."""
        line = {key: json_value(v) for key, v in metrics.items()}
        self._metrics.write(json.dumps(line) + "\n")
        self._metrics.flush()
        self.last_round = metrics.get("round", self.last_round)
        self._mark_unfinished()
        if self.save_weights and w is not None:
            key = f"round-{metrics['round']}"
            if isinstance(w, torch.Tensor):
                self._weights[key] = w.detach().cpu().numpy()
            else:
                self._weights.update({f"{key}.{name}": p.detach().cpu().numpy() for name, p in w.items()})

    def record_round(self, report: dict[str, Any]) -> None:
        """Append one round's operator report (who replied, who was rejected and why) to rounds.jsonl."""
        if self._rounds is None:
            self._rounds, _ = self._open_log("rounds.jsonl")
        self._rounds.write(json.dumps({key: json_value(v) for key, v in report.items()}) + "\n")
        self._rounds.flush()

    def close(self, error: BaseException | None = None) -> None:
        """Finish the run: close the logs and write weights.npz (keys ``round-<t>``); remove the unfinished
        mark, or after ``error`` mark the folder failed (failed.json: the error, its type, the last recorded
        round, the rounds completed) and rewrite privacy.json with what they spent."""
        self._metrics.close()
        if self._rounds is not None:
            self._rounds.close()
        if self._weights:
            np.savez(self.directory / "weights.npz", **self._weights)
        if error is None:
            (self.directory / FAILED).unlink(missing_ok=True)
        else:
            reason = str(error) or ("interrupted (SIGINT or SIGTERM)" if isinstance(error, KeyboardInterrupt)
                                    else type(error).__name__)
            failed = {"reason": reason, "error": type(error).__name__, "last-round": self.last_round,
                      "completed-rounds": self.completed}
            (self.directory / FAILED).write_text(json.dumps(failed, indent=2) + "\n")
            if self.spent is not None:
                self._write_spent()

    def _write_spent(self) -> None:
        """privacy.json of a run that stopped after ``completed`` rounds: the ledger of those rounds, not of
        the rounds planned (nothing was released before round 1 finished), with the randomness the planned
        statement names."""
        if self.completed:
            assert self.spent is not None
            self.write_ledger(dataclasses.replace(self.spent(self.completed),
                                                  randomness=self.ledger.randomness))
            data = json.loads((self.directory / "privacy.json").read_text())
        else:
            data = {"released": "nothing: the run stopped before round 1 finished"}
        data["stopped-after-round"] = self.completed
        (self.directory / "privacy.json").write_text(json.dumps(data, indent=2, default=json_value) + "\n")


@contextmanager
def closing(writers: Sequence[RunWriter]) -> Iterator[None]:
    """Close ``writers`` when the block ends; when it raises (an error, an interrupt), each folder is marked
    failed first (:meth:`RunWriter.close`), then the exception goes on."""
    try:
        yield
    except BaseException as error:
        for writer in writers:
            writer.close(error)
        raise
    for writer in writers:
        writer.close()


def failure(directory: str | Path) -> dict[str, Any] | None:
    """What failed.json says of a run folder (None for a run that did not fail): a reader of results checks
    this before it takes a folder's metrics for a finished run."""
    path = Path(directory) / FAILED
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """A JSON-lines file as a list of dicts."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_metrics(directory: str | Path) -> list[dict[str, Any]]:
    """The metrics.jsonl of a run folder as a list of dicts."""
    return read_jsonl(Path(directory) / "metrics.jsonl")


def progress_bar(total: int, enabled: bool, initial: int = 0, unit: str = "round") -> Any:
    """A tqdm bar over ``total`` rounds (None when disabled): long runs show where they are."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, desc="dpadmm")
