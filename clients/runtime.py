"""The device's own ClientApp runtime: a long-lived process that answers its SuperNode's messages with the
dpadmm installed on the device, never with code the run's submitter ships.

Flower 1.41 runs a deployed SuperNode's ClientApp from the run's FAB: with the default ``--isolation
subprocess`` the SuperNode starts ``flwr-clientapp`` for every message, which installs the FAB and puts it
first on ``sys.path``, so the code that reads the device's data and secret is whatever ``flwr run`` sent,
with the node user's rights. Flower's one guard, ``flower-supernode --trusted-entities``, checks signatures
that its SuperLink obtains from Flower Hub for Hub apps; a device that wants to run its own installation
has no use for it. ``--isolation process`` instead leaves the tasks to a runtime the operator starts: it
asks the SuperNode's runtime API for a task (``AcquireTask``), pulls the message, the context, the run and
the FAB, and pushes the reply and the context back. This module is that runtime. It reads the FAB's
identity only, refuses a run whose FAB names another app or version than the installed one, and answers
with :data:`clients.client_app.app`, imported once from the installation.

Each task runs in a thread of its own, as Flower's SuperExec runs each in a process of its own (a task
whose run is gone must not hold up the next). One process for the device's life also means that nothing is
repeated per message (Flower's
``flwr-clientapp`` costs an interpreter, ``import flwr`` and ``import torch`` for each): the data set is
read once (the ClientApp's caches), the accountant runs once per run (the device's budget keeps the
calibration, :mod:`dpadmm.privacy.device`).

What leaves the device: the ClientApp's replies (releases and refusals that name only what the server sent
and the operator set). Any other failure is answered with one fixed text, :data:`FAILED`; its details go
to this process's own log, since an exception's text may hold a number computed from the data.
"""

from __future__ import annotations

import faulthandler
import importlib.metadata
import logging
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from flwr.app import Message
from flwr.app.error import Error
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest, SendTaskHeartbeatRequest  # pylint: disable=E0611
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import RetryInvoker, make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from dpadmm.privacy.device import DeviceRefused, node_state_dir, policy_in_force
from dpadmm.wire import refusal_in

APP_ID = "dpadmm/dpadmm"  # the FAB's id: [tool.flwr.app] publisher / [project] name
FAILED = "the node could not answer this message; its operator's log has the reason"
TASK_RETRY_SECONDS = 30.0  # the longest a task's call to the SuperNode is retried
# Tasks run side by side, each in a thread of its own, as Flower's SuperExec runs each in a process of its
# own: a task whose run is gone (a SuperLink restarted while its message was on its way: the SuperNode keeps
# a task whose message never arrives) must not hold up the next one. One run's messages come one at a time.
MAX_TASKS = 4
log = logging.getLogger("dpadmm.node")


def installed_version() -> str:
    """The version of the dpadmm installed on this device."""
    return importlib.metadata.version("dpadmm")


@dataclass(frozen=True)
class Options:
    """Where the SuperNode's runtime API listens, and how often to ask it for a task."""

    address: str = "127.0.0.1:9094"
    insecure: bool = True  # the runtime API on the device's own loopback
    root_certificates: bytes | None = None
    # Seconds between two questions when no task is pending: Flower's SuperExec's own cadence. A question
    # costs the SuperNode and the runtime about 5 ms of CPU together; at 4 a second, 50 SuperNodes on one host
    # spent a core on them while idle. A message waits 0.5 s for its question on average, as under Flower's.
    poll: float = 1.0


def _client(options: Options, invoker: RetryInvoker, *interceptors: object) -> RuntimeHttpClient:
    """A client of the SuperNode's runtime API whose calls retry as ``invoker`` says."""
    return RuntimeHttpClient.from_server_address(
        server_address=options.address, insecure=options.insecure,
        root_certificates=options.root_certificates, interceptors=list(interceptors), retry_invoker=invoker)


def _invoker(tries: int | None = None, seconds: float | None = None) -> RetryInvoker:
    """Flower's retries of a runtime-API call, bounded: ``tries`` attempts, ``seconds`` in all. Flower's
    own are unbounded, which suits a process per task; one process for every task must not wait forever on
    a task whose run is gone (a SuperLink restarted mid-round), or every later task waits behind it."""
    invoker = make_simple_http_retry_invoker()
    invoker.max_tries, invoker.max_time = tries, seconds
    return invoker


def fab_refusal(fab_id: str, fab_version: str) -> str | None:
    """Why the device refuses a run whose FAB is ``fab_id`` at ``fab_version``, or None: it answers only runs
    of the app and version installed on it (it runs the installation's code whatever the FAB holds)."""
    version = installed_version()
    if fab_id != APP_ID or fab_version != version:
        return (f"this device runs only {APP_ID} {version}, installed by its operator; the run's app is "
                f"{fab_id} {fab_version}, which it refuses to answer")
    return None


def answer(message: Message, context: object, fab_id: str, fab_version: str,
           app: Callable[..., Message] | None = None) -> tuple[Message, str, str]:
    """(the reply, its sub-status, its details) of one task: the installed ClientApp's reply, a refusal
    (``wire.REFUSED_KEY``: of another app's run, or the ClientApp's own, by its device's policy and budget or
    of its configuration or data), or :data:`FAILED` where the ClientApp raised (details logged here only).
    A refusal is logged here with its reason, as the server logs it, and its task is ``failed`` with the
    reason as details."""
    from clients import client_app

    refused = fab_refusal(fab_id, fab_version)
    if refused is not None:  # a refusal, which a dpadmm ServerApp of any version ends the run on at once
        reply = client_app.refusal(message, refused)
    else:
        try:
            reply = (app or client_app.app)(message=message, context=context)
        except Exception:  # noqa: BLE001 (any failure: the server learns only that it failed)
            log.error("dpadmm node: the ClientApp failed on a %s message of run %s:\n%s",
                      message.metadata.message_type, message.metadata.run_id, traceback.format_exc())
            return (Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=FAILED),
                            reply_to=message), SubStatus.FAILED, FAILED)
        refused = refusal_in(reply)
    if refused is None:
        return reply, SubStatus.COMPLETED, ""
    log.warning("dpadmm node: refused a %s message of run %s: %s", message.metadata.message_type,
                message.metadata.run_id, refused)
    return reply, SubStatus.FAILED, refused


def run_task(options: Options, token: str) -> None:
    """Pull one task's input from the SuperNode, answer it (:func:`answer`), push the reply and context."""
    invoker = _invoker(seconds=TASK_RETRY_SECONDS)
    client = _client(options, invoker, RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                     RuntimeTokenHttpInterceptor(token))

    def beat() -> bool:  # Flower's own stops its process when the task is gone; this one outlives tasks
        try:
            client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
        except Exception:  # noqa: BLE001 (a missed heartbeat: retried by the sender)
            return False
        return True

    heartbeat = HeartbeatSender(beat)
    heartbeat.start()
    context = None
    status, details = SubStatus.FAILED, FAILED
    try:
        started = time.perf_counter()
        message, context, run, _ = pull_task_input(client)  # the FAB's bytes are never installed or read
        reply, status, details = answer(message, context, run.fab_id, run.fab_version)
        push_message(client, reply, context)
        log.info("dpadmm node: answered a %s message of run %s (%s) in %.2f s", message.metadata.message_type,
                 run.run_id, status, time.perf_counter() - started)
    except Exception:  # noqa: BLE001 (a lost SuperNode, a malformed task: logged, the next task goes on)
        log.error("dpadmm node: a task failed:\n%s", traceback.format_exc())
    finally:
        invoker.max_tries = 1  # as Flower's own task process on its way out: no call waits any longer
        heartbeat.stop()
        push_task_output(client=client, context=context, sub_status=status, details=details)
        client.close()


def serve(options: Options, stop: threading.Event | None = None) -> None:
    """Ask the SuperNode for ClientApp tasks and answer each with the installed app (each in a thread of its
    own, at most :data:`MAX_TASKS` at once), until ``stop`` is set (without one: until SIGTERM or SIGINT,
    which must then reach the main thread)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: every thread's stack
    if stop is None:
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    # one attempt per question: the loop asks again, and sees ``stop`` between two questions (a SuperNode
    # that exits, refused by its SuperLink, ends the runtime beside it at once)
    client = _client(options, _invoker(tries=1), RuntimeVersionHttpInterceptor(component_name="SuperExec"))
    log.info("dpadmm node: answering the SuperNode at %s with %s %s", options.address, APP_ID,
             installed_version())
    state = node_state_dir()  # the runs' state folder unless a SuperNode's node config names another
    try:
        log.info("dpadmm node: %s (state folder %s, unless a node config names another state-dir)",
                 policy_in_force(state), state)
    except DeviceRefused as refused:  # each run is refused with this reason until the operator acts
        log.error("dpadmm node: %s", refused)
    last_error = ""
    running: list[threading.Thread] = []
    try:
        while not stop.is_set():
            running = [task for task in running if task.is_alive()]
            if len(running) >= MAX_TASKS:
                stop.wait(options.poll)
                continue
            try:
                acquired = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
            except Exception as error:  # noqa: BLE001 (the SuperNode is starting or restarting: ask again)
                said = f"{type(error).__name__}: {error}"
                if said != last_error:  # once per kind of failure, not once a second
                    log.warning("dpadmm node: the SuperNode gave no task (%s); asking again", said)
                    last_error = said
                stop.wait(1.0)
                continue
            last_error = ""
            if acquired.HasField("task") and acquired.token:
                task = threading.Thread(target=run_task, args=(options, acquired.token), daemon=True,
                                        name=f"task-{acquired.task.task_id}")
                task.start()
                running.append(task)
            else:
                stop.wait(options.poll)
    finally:
        client.close()


def configure_logging() -> None:
    """Log to stderr with times (a SuperNode's log is the operator's), and import the installed ClientApp and
    the privacy accountant now, before the first task: torch, flwr, the app and dp_accounting (1.4 s on its
    own, which the first run's calibration would pay) once for the process's life."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per question to the SuperNode
    started = time.perf_counter()
    import dp_accounting  # noqa: F401

    import clients.client_app  # noqa: F401

    log.info("dpadmm node: the installed ClientApp is loaded (%.1f s)", time.perf_counter() - started)
