"""An env worker: one env type's code and the instances of the leases it holds.

Started by the front (``envfarm.worker.WorkerProcess``) as ``python -m envfarm.worker CONFIG``
with the channel on fds 0 and 1. It imports what env code needs, enters the kernel jail, says
``ready``, and only then receives the env's code (``load``). From there on it answers requests
one frame each way: ``new`` (an instance of the template or of a task's own starting
database, or from the image the frame carries), ``drop`` it, ``call`` a tool (the answer, then
the pages of the database that the call changed: the front keeps each lease's committed state),
``reset``, ``snapshot``, ``restore``/``clone`` (a fork), ``task_initial`` (a task's starting
database). Generated code never sees the channel's fds by name; what it could do with them
anyway is bounded by the front, which checks every reply.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from envfarm.models import CallResult, ToolError
from envfarm.worker import _frames

#: How long the tasks of a request may take to hand their reply to the pipe at exit.
_EXIT_GRACE_S = 1.0
#: Largest tool answer passed on (an agent reads it; the front enforces it too).
MAX_RESULT_BYTES = _frames.MAX_RESULT_BYTES
#: Threads (tasks of its uid) a worker may have: FastAPI runs sync handlers on up to 40 anyio
#: threads, plus the event loop, the call watchdog and executors. A thread bomb stops here,
#: with a typed error, instead of filling the host's pid table.
MAX_THREADS = 128


def _private_channel() -> tuple[int, int]:
    """Move the channel off fds 0/1, so ``print`` and stray writes go nowhere."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    return proto_in, proto_out


def _leave_project_root() -> None:
    """The front puts the project's root on PYTHONPATH so that this process finds envfarm. A
    checkout's root holds much more (tests, benchmarks, .git, local settings): once envfarm is
    imported its package folder is enough, so the root leaves sys.path and with it the jail's
    readable roots, which follow sys.path. An installed envfarm's root is site-packages: kept."""
    import envfarm

    root = os.path.dirname(os.path.dirname(os.path.realpath(envfarm.__file__)))
    if os.path.basename(root) in ("site-packages", "dist-packages"):
        return
    sys.path[:] = [p for p in sys.path if not (isinstance(p, str) and os.path.isabs(p)
                                               and os.path.realpath(p) == root)]


def _enter_jail(config: dict[str, Any], keep: tuple[int, ...]) -> str:
    from envfarm import jail

    policy = jail.JailPolicy(memory_mb=config.get("memory_mb"), max_open_files=64, threads=True,
                             processes=False, uid=jail.uid_from_config(config),
                             keep_imports=True,
                             max_threads=MAX_THREADS if "uid_base" in config else None)
    if not config.get("jail", True):  # switching uid needs no kernel feature: still done
        jail.switch_identity(policy)
        return f"unconfined (the farm was started with --allow-unconfined), {_who(policy)}"
    return f"{jail.enter(policy, keep_fds=keep).describe()}, {_who(policy)}"


def _who(policy) -> str:
    uid = os.getuid()
    if policy.max_threads and uid == policy.uid:
        return f"uid {uid}, at most {policy.max_threads} threads"
    return f"uid {uid}"


class Worker:
    """The worker's state: its env runtime and instances, by the front's instance ids."""

    def __init__(self, send) -> None:
        self.send = send
        self.runtime = None
        self.instances: dict[int, Any] = {}
        #: Per instance, the database image the front holds as its committed state.
        self.shipped: dict[int, bytes] = {}
        self.tasks: set[asyncio.Task] = set()

    # -- frames in ------------------------------------------------------------------------------
    def on_frame(self, header: dict[str, Any], payload: bytes) -> None:
        op, rid = header.get("op"), header.get("id")
        if op == "new":  # in order, before any later frame: no await between them
            task = header.get("task")  # a task's own start (EnvFactory's per-scenario state)
            inst = self.runtime.instance(
                self.runtime.task_initial(int(task)) if task is not None else None)
            if payload:  # a lease moved here from a lost worker: its committed state
                inst.restore(payload)
            self.instances[int(header["inst"])] = inst
            # the object its next call's rollback point is, read calls then ship nothing
            self.shipped[int(header["inst"])] = payload or inst.initial
            return
        if op == "drop":
            self.shipped.pop(int(header["inst"]), None)
            inst = self.instances.pop(int(header["inst"]), None)
            if inst is not None:
                self._spawn(self._drop(inst), None)
            return
        self._spawn(self._answer(op, header, payload), rid)

    def _spawn(self, coro, rid) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _drop(self, inst) -> None:
        async with inst.lock:
            inst.close()

    async def _answer(self, op: str, header: dict[str, Any], payload: bytes) -> None:
        rid = header.get("id")
        try:
            reply, out = await self._do(op, header, payload)
        except Exception as exc:  # noqa: BLE001 - a bad request is answered, never fatal
            reply, out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}, b""
        reply["id"] = rid
        self.send(reply, out)

    async def _do(self, op: str, header: dict[str, Any], payload: bytes
                  ) -> tuple[dict[str, Any], bytes]:
        if op == "ping":
            return {"ok": True}, b""
        if op == "task_initial":  # the starting database of a task with a state of its own
            return {"ok": True}, self.runtime.task_initial(int(header["task"]))
        inst = self.instances.get(int(header.get("inst", -1)))
        if inst is None:
            return {"ok": False, "error": f"no instance {header.get('inst')}"}, b""
        if op == "call":
            res = await inst.call(header["tool"], header.get("args"))
            body = res.model_dump_json().encode()
            if len(body) > MAX_RESULT_BYTES:
                res = CallResult(ok=False, status=res.status, elapsed_ms=res.elapsed_ms,
                                 error=ToolError(kind="env_error", message=(
                                     f"tool {header['tool']!r} answered {len(body)} bytes; "
                                     f"the limit is {MAX_RESULT_BYTES}")))
                body = res.model_dump_json().encode()
            reply = {"ok": True, "rlen": len(body)}
            if self.runtime.timeouts:  # timed-out code may still be running here
                reply["drain"] = True
            return reply, body + self._delta(int(header["inst"]), inst)
        if op == "reset":
            async with inst.lock:
                inst.reset()
                self.shipped[int(header["inst"])] = inst.initial
            return {"ok": True}, b""
        if op == "snapshot":
            async with inst.lock:
                return {"ok": True}, inst.snapshot()
        if op in ("restore", "clone"):  # a fork: the parent's state, sent or held here
            return await self._restore(op, header, inst, payload)
        return {"ok": False, "error": f"unknown op {op!r}"}, b""

    async def _restore(self, op: str, header: dict[str, Any], inst, payload: bytes
                       ) -> tuple[dict[str, Any], bytes]:
        """Give ``inst`` the state ``payload`` holds (``restore``) or its source's (``clone``:
        the answer carries the pages where that differs from what the front holds of the
        source, so the front's copy of the clone is exact)."""
        delta, src_key = b"", header.get("src")
        if op == "clone":
            src = self.instances.get(int(src_key if src_key is not None else -1))
            if src is None:
                return {"ok": True, "restored": False, "error": "no source instance"}, b""
            async with src.lock:
                payload = src.snapshot()
            delta = _frames.encode_delta(self.shipped[int(src_key)], payload)
        async with inst.lock:
            try:
                inst.restore(payload)
            except Exception as exc:  # noqa: BLE001 - bytes it cannot read: say so
                return {"ok": True, "restored": False,
                        "error": f"{type(exc).__name__}: {exc}"[:300]}, b""
            self.shipped[int(header["inst"])] = payload  # what the front holds of it now
        return {"ok": True, "restored": True, "rlen": 0}, delta

    def _delta(self, key: int, inst) -> bytes:
        """The pages the call changed since the image the front holds (none: b"")."""
        image = inst.committed()  # cached while nothing was written: read calls ship none
        shipped = self.shipped.get(key)
        if shipped is image:
            return b""
        self.shipped[key] = image
        return _frames.encode_delta(shipped or b"", image)


def _load(header: dict[str, Any]):
    from envfarm.models import EnvBundle
    from envfarm.runtime import EnvRuntime

    bundle = EnvBundle.model_validate(header["bundle"])
    return EnvRuntime(bundle, call_timeout_s=header["call_timeout_s"],
                      max_payload_bytes=header["max_payload_bytes"],
                      foreign_keys=header["foreign_keys"])


async def _serve(worker: Worker, proto_in: int, proto_out: int) -> None:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    reader = _frames.FrameReader()

    class Channel(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            try:
                for body in reader.feed(data):
                    worker.on_frame(*_frames.decode(body))
            except Exception:  # noqa: BLE001 - the front sent garbage: stop
                if not done.done():
                    done.set_result(None)

        def connection_lost(self, exc) -> None:
            if not done.done():
                done.set_result(None)

    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(proto_out, "wb", 0))
    batch: list[bytes] = []  # the replies of one loop iteration go out in one write

    def flush() -> None:
        out.write(b"".join(batch))
        batch.clear()

    def send(header: dict[str, Any], payload: bytes = b"") -> None:
        if not batch:
            loop.call_soon(flush)
        batch.append(_frames.encode(header, payload))

    worker.send = send
    await loop.connect_read_pipe(Channel, os.fdopen(proto_in, "rb", 0))
    await done  # the front closed the channel: finish what is in flight, then exit
    if worker.tasks:
        await asyncio.wait(set(worker.tasks), timeout=_EXIT_GRACE_S)


def main() -> None:
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    proto_in, proto_out = _private_channel()
    # Everything env code needs is imported before the jail closes the file system.
    import fastapi  # noqa: F401
    import sqlalchemy.orm  # noqa: F401

    import envfarm.runtime  # noqa: F401

    _leave_project_root()
    # The event loop's self-pipe is a socketpair: made now, as the jail forbids sockets.
    loop = asyncio.new_event_loop()
    # Only fds 0-2 were inherited (the front spawns with close_fds): every other open fd is
    # this process's own (the channel, the loop's), and the jail keeps them.
    jail = _enter_jail(config, tuple(int(fd) for fd in os.listdir("/proc/self/fd")))
    hello = _frames.encode({"ready": True, "pid": os.getpid(), "jail": jail})
    _frames.write_all(proto_out, hello)
    try:
        header, _ = _frames.read_blocking(proto_in, time.monotonic() + 3600)
    except (EOFError, TimeoutError, _frames.FrameError):
        return
    try:
        runtime = _load(header)
    except Exception as exc:  # noqa: BLE001 - EnvLoadError, or anything the code raised
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        _frames.write_all(proto_out, _frames.encode({"ok": False, "error": message[:2000]}))
        return
    leaks = []
    if header.get("probe_module_state"):
        from envfarm.check import module_state_leaks

        leaks = loop.run_until_complete(module_state_leaks(runtime))
    try:
        openapi = runtime.mcp_openapi()  # for MCP listings as AWM renders them
    except Exception:  # noqa: BLE001 - generated code's schema may not render
        openapi = None
    loaded = {"ok": True, "tools": [t.model_dump() for t in runtime.tools], "openapi": openapi,
              "problems": runtime.problems, "build_s": runtime.build_seconds,
              "tables": runtime.template.tables, "rows": runtime.template.rows,
              "module_state": leaks}
    _frames.write_all(proto_out, _frames.encode(loaded, runtime.template.data))
    worker = Worker(send=None)
    worker.runtime = runtime
    asyncio.set_event_loop(loop)
    loop.run_until_complete(_serve(worker, proto_in, proto_out))
    os._exit(0)  # skip interpreter teardown: env code's finalizers have nothing left to do
