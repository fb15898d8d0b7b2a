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

A message larger than the operator's ``max-message-bytes`` (:class:`dpadmm.privacy.device.Policy`) is
refused while it is pulled, before the bytes past the limit are read (:class:`TaskClient`): this process's
memory, not the SuperNode's, which holds the whole message before it offers the task.
"""

from __future__ import annotations

import faulthandler
import importlib.metadata
import json
import logging
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.app.error import Error
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, message_from_proto, run_from_proto
from flwr.proto.message_pb2 import (  # pylint: disable=E0611
    ConfirmMessageReceivedRequest,
    ConfirmMessageReceivedResponse,
    PullObjectRequest,
    PullObjectResponse,
)
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullAppMessagesResponse,
    PullTaskInputRequest,
    PullTaskInputResponse,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.inflatable.inflatable_object import (
    get_object_body,
    get_object_head_values_from_object_content,
)
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import RetryInvoker, make_simple_http_retry_invoker
from flwr.supercore.run import Run
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from dpadmm.privacy.device import DeviceRefused, Policy, node_state_dir, policy_in_force, read_policy
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


def _client(options: Options, invoker: RetryInvoker, *interceptors: object,
            kind: type[RuntimeHttpClient] = RuntimeHttpClient) -> RuntimeHttpClient:
    """A client of the SuperNode's runtime API (of class ``kind``) whose calls retry as ``invoker`` says."""
    return kind.from_server_address(
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


class TooLarge(Exception):
    """A task's message crosses the device's ``max-message-bytes``; the text names that limit only."""


def _copied(content: bytes) -> list[str]:
    """The objects that an object's inflation copies, once per copy: an Array's chunks in order (Flower sends
    identical chunks once: an array of zeros is one 5 MiB chunk, however long), an ArrayRecord's arrays and a
    RecordDict's records by name (one object may stand under many names), any other object's children."""
    kind, children, _ = get_object_head_values_from_object_content(content)
    if kind == Array.__qualname__:
        return [children[i] for i in json.loads(get_object_body(content, Array))["arraychunk_ids"]]
    for record in (ArrayRecord, RecordDict):
        if kind == record.__qualname__:
            return list(json.loads(get_object_body(content, record)).values())
    return children


class TaskClient(RuntimeHttpClient):
    """The runtime API as one task's :func:`pull_task_input` (Flower's own) calls it, which reads at most the
    device's ``max-message-bytes`` of the task's message.

    What Flower 1.41 lets a device know of a message's size before it pulls the payload: nothing but the
    lengths of the HTTP responses that carry it. ``PullMessages`` lists the message's metadata (no size
    field) and its tree of object ids (SHA-256 of the contents; no sizes, no types); each object then comes
    in a ``PullObject`` call of its own, two at a time (``FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS``), and Flower
    inflates the message only once all are pulled, holding them all. Flower's senders cut an array into
    5 MiB chunks (``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, the sender's setting, which a server may raise to
    send one object of any size up to gRPC's 2 GiB), and send identical chunks once; the listing holds no
    content as Flower's ServerApp pushes a message, but Flower's SuperLink and SuperNode pass on whatever
    content a ServerApp of its own puts there. No bound on the message follows from its tree (a count of
    objects times the largest object is unbounded, the sender choosing the chunk size), so the runtime
    counts as it pulls:

    - the listing's and each object's length as the SuperNode's HTTP response announces it
      (``Content-Length``), before its body is read (:meth:`_count`): the pull stops at the response that
      crosses the limit, whatever the server's chunk size, and no more than the limit is ever read;
    - once every object is there and before Flower inflates them, the message's size as inflated (a chunk
      counted each time an array uses it, an array and a record each time a name uses it): an array of zeros
      sent as one chunk cannot inflate past the limit either.

    Measured (tests/test_runtime.py, limit 8 MiB, five 48 MiB and 1 MiB messages, four tasks at once): the
    runtime's peak allocation is 11.4 to 11.9 MiB, one 5 MiB chunk as read and as parsed; a message in one
    48 MiB chunk, or inside its listing, is refused before its body is read.

    A refusal is a reply (``wire.REFUSED_KEY``) to the message's metadata as listed, which the server sees as
    any refusal; a listing over the limit has no metadata to reply to: the task fails with the refusal as its
    details, and the server's message times out. The SuperNode itself (``flower-supernode``) pulls every
    object of a message from its SuperLink into its in-memory object store before it offers the task: the
    limit protects this runtime process, not the SuperNode's; the refusal confirms the message so that the
    SuperNode drops its copy.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.limit = 0  # set from the node's policy with the task's input, before any of the message is read
        self.announced = 0  # the bytes of the listing and objects pulled so far, as their responses announce
        self._sizes: dict[str, int] = {}
        self._copies: dict[str, list[str]] = {}
        self._task: PullTaskInputResponse | None = None
        self._unreadable: DeviceRefused | None = None
        self._listed: PullAppMessagesResponse | None = None
        self._confirmed = False
        # Flower's client reads a response whole before it returns it; httpx calls its response hooks first
        self._client.event_hooks["response"].append(self._count)

    def PullTaskInput(self, request: PullTaskInputRequest) -> PullTaskInputResponse:  # noqa: N802 (Flower's)
        """The task's context, run and FAB, kept to refuse the message without its content; the limit is the
        policy's where the node's state is (its node config ``state-dir``, as the ClientApp reads it)."""
        from dpadmm.privacy.randomness import state_dir

        self._task = super().PullTaskInput(request)
        try:
            self.limit = read_policy(state_dir(context_from_proto(self._task.context).node_config)
                                     ).max_message_bytes
        except DeviceRefused as refused:  # refused once the message is listed, with a reply naming why;
            self._unreadable = refused  # the listing alone is bounded by the default policy's limit
            self.limit = Policy().max_message_bytes
        return self._task

    def PullMessages(self, request: PullAppMessagesRequest) -> PullAppMessagesResponse:  # noqa: N802
        """The message's metadata and object tree, counted (:meth:`_count`) before they were read. A policy
        that cannot be read refuses the message now."""
        self._listed = super().PullMessages(request)
        if self._unreadable is not None:
            raise self._unreadable
        return self._listed

    def PullObject(self, request: PullObjectRequest) -> PullObjectResponse:  # noqa: N802
        """One object, whose length was counted before its body was read (:meth:`_count`)."""
        response = super().PullObject(request)
        if response.object_available:
            copies = _copied(response.object_content)
            with self._lock:
                self._sizes[request.object_id] = len(response.object_content)
                self._copies[request.object_id] = copies
        return response

    def ConfirmMessageReceived(  # noqa: N802
            self, request: ConfirmMessageReceivedRequest) -> ConfirmMessageReceivedResponse:
        """Every object is pulled: the SuperNode drops its copy; the message as inflated must fit too."""
        response = super().ConfirmMessageReceived(request)
        self._confirmed = True
        inflated: dict[str, int] = {}

        def size(object_id: str) -> int:
            if object_id not in inflated:
                inflated[object_id] = self._sizes[object_id] + sum(size(c) for c in self._copies[object_id])
            return inflated[object_id]

        if size(request.message_object_id) > self.limit:
            raise TooLarge(self.refusal())
        return response

    def _count(self, response: httpx.Response) -> None:
        """Count the message's bytes as each response announces its length, before its body is read: raising
        here, httpx closes the response unread, and Flower's pull stops (:func:`pull_objects` stops its
        other pulls at the first error)."""
        if not response.request.url.path.endswith(("/pull-messages", "/pull-object")):
            return
        length = response.headers.get("content-length")
        if length is None or response.headers.get("content-encoding", "identity") != "identity":
            # fail closed: a body of unknown length, or one that inflates as it is read, may be of any length
            raise ValueError("the SuperNode's runtime API sent a message without its length")
        with self._lock:
            self.announced += int(length)
            if self.announced > self.limit:
                raise TooLarge(self.refusal())

    def refusal(self) -> str:
        """Why the message is refused: the operator's limit, nothing of the message but that it crosses it."""
        return (f"this device takes messages of at most {self.limit} bytes (its operator's "
                "max-message-bytes); the server's message is larger, and was refused before more than that "
                "was read")

    def question(self) -> tuple[Message | None, Context, Run]:
        """The listed message (its metadata, without its content), its context and run: what a refusal of the
        message needs. The SuperNode is told the message was received, so that it drops its copy. No message
        where the listing itself crossed the limit (a server's metadata holds no content: Flower's ServerApp
        pushes a message's content as objects, but its SuperLink passes on whatever a ServerApp pushes)."""
        assert self._task is not None  # the limit is read with the task's input
        context = context_from_proto(self._task.context)
        run = run_from_proto(self._task.run)
        if self._listed is None:
            return None, context, run
        tree = self._listed.message_object_trees[0]
        if not self._confirmed:
            self._confirmed = True
            super().ConfirmMessageReceived(ConfirmMessageReceivedRequest(
                node=Node(node_id=context.node_id), run_id=context.run_id, message_object_id=tree.object_id))
        message = message_from_proto(self._listed.messages_list[0])
        message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's pull_task_input sets it
        return message, context, run


def run_task(options: Options, token: str) -> None:
    """Pull one task's input from the SuperNode, answer it (:func:`answer`), push the reply and context."""
    from clients.client_app import refusal

    invoker = _invoker(seconds=TASK_RETRY_SECONDS)
    client = _client(options, invoker, RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                     RuntimeTokenHttpInterceptor(token), kind=TaskClient)
    assert isinstance(client, TaskClient)

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
        try:
            message, context, run, _ = pull_task_input(client)  # the FAB's bytes are never installed or read
        except (TooLarge, DeviceRefused) as refused:  # the message's size, or a policy that cannot be read
            listed, context, run = client.question()
            status, details = SubStatus.FAILED, str(refused)
            if listed is None:  # nothing to reply to: the task fails, the server's message times out
                log.warning("dpadmm node: refused a message of run %s before its listing was read: %s",
                            run.run_id, details)
                return
            message = listed
            log.warning("dpadmm node: refused a %s message of run %s: %s", message.metadata.message_type,
                        run.run_id, details)
            reply = refusal(message, details)
        else:
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
