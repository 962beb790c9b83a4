"""OpenEnv's WebSocket protocol over the lease API: ``/ws``, as OpenEnv's AWM env speaks it.

A client (openenv-core's ``MCPToolClient``, OpenEnv's ``AWMEnv``, TRL through either) sends JSON
messages ``{"type": "reset" | "step" | "state" | "close", "data": ...}`` and gets
``{"type": "observation", "data": {"observation", "reward", "done"}}``, ``{"type": "state"}`` or
``{"type": "error", "data": {"message", "code"}}``. A session is one lease: ``reset(scenario=,
task_idx=)`` creates it (with the tenant key the connection carried: ``X-Envfarm-Key`` or
``?key=``, checked before the socket is accepted), steps are tool calls on it, and closing the
socket releases it. Observations carry the fields of OpenEnv's AWM env (``reward_type``,
``scenario``, ``task``, ``tools``, ``tool_result``, ``error`` ...) and its hidden tools
(``verify``, ``done``, ``__list_scenarios__``), plus ``fork``: a new lease with this one's state
that another session attaches with ``reset(scenario=, lease_id=, lease_token=)``. A typed farm
error rides in ``metadata`` (``error_kind``, ``error_type``), which both clients read.

Every step goes through the lease API (``LeaseAPI.request``): in-process on the ``--no-ray``
farm, by handle to the owner replica under Serve, so quotas, placement and owner routing apply
as to any HTTP client.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket, WebSocketDisconnect

from envfarm._asgi import call_asgi

from envfarm.catalog import Catalog, normalize_name
from envfarm.errors import AgentError, EnvCallError, EnvfarmError, error_from_body
from envfarm.farm._openenv_obs import (
    Action,
    CallTool,
    ListTools,
    ResetArgs,
    error_message,
    list_scenarios,
    observation,
    step_reward,
    tool_error_type,
    verdict_type,
)
from envfarm.farm._tenants import KEY_HEADER

if TYPE_CHECKING:
    from envfarm.farm._core import FarmCore

#: Where OpenEnv clients connect: ``<base_url>/ws``, as to OpenEnv's own servers.
OPENENV_PATH = "/ws"
#: The hidden tools: answered by the session, never listed.
DONE, VERIFY, LIST_SCENARIOS, FORK = "done", "verify", "__list_scenarios__", "fork"
#: Releases under way (held so a cancelled handler's release runs to its end).
_RELEASING: set[asyncio.Task[None]] = set()
#: How long a refused connection stays open for its client to read why.
REFUSAL_WAIT_S = 5.0
#: Largest message a session reads (a step is a tool call; the lease API's body limit is 1 MiB).
MAX_MESSAGE_BYTES = 1 << 20


class LeaseAPI(Protocol):
    """What a session needs of the farm: its catalog, the tenants' keys, the lease API."""

    catalog: Catalog

    def served(self) -> list[str]: ...

    def identify(self, key: str | None) -> str: ...

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]: ...


@dataclass
class Session:
    """One socket's state: its lease and episode."""

    api: LeaseAPI
    key: str | None
    lease: dict[str, Any] | None = None
    task: str | None = None
    task_idx: int | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    episode_id: str | None = None
    step_count: int = 0
    done: bool = False
    reward_config: dict[str, float] = field(default_factory=dict)

    # -- the lease API ---------------------------------------------------------------------
    async def _call(self, method: str, path: str, body: Any = None, *,
                    lease: bool = True, token: str | None = None) -> Any:
        """The lease API's JSON answer (its error raised as the farm raised it); with this
        session's lease token unless ``lease`` is False or another ``token`` is given."""
        headers = {}
        token = token or (self.lease["token"] if lease and self.lease is not None else None)
        if token:
            headers["authorization"] = f"Bearer {token}"
        if self.key:
            headers[KEY_HEADER] = self.key
        status, raw = await self.api.request(method, path, body, headers)
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        if status >= 400:
            error = payload.get("error") if isinstance(payload, dict) else None
            raise error_from_body(status, error if isinstance(error, dict) else {
                "message": f"the farm answered HTTP {status}"})
        return payload

    @property
    def path(self) -> str:
        assert self.lease is not None
        return f"/envs/{self.lease['env']}/leases/{self.lease['lease_id']}"

    async def release(self) -> None:
        """Give the lease back (idempotent; a lease already gone is fine)."""
        if self.lease is None:
            return
        try:
            await self._call("DELETE", self.path)
        except EnvfarmError:
            pass
        self.lease = None

    # -- reset -----------------------------------------------------------------------------
    async def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        self.done = False
        try:
            args = ResetArgs.model_validate(data)
        except ValidationError as exc:
            return observation("reset_error", error=f"invalid reset arguments: "
                               f"{exc.errors()[0]['msg']}")
        if not args.scenario:
            return observation("reset_error", error="Parameter 'scenario' is required")
        env = normalize_name(args.scenario)
        self.reward_config = dict(args.reward_config or {})
        try:
            if args.lease_id is not None:
                await self._attach(env, args.lease_id, args.lease_token or "", args.task_idx)
            else:
                await self._open(env, args.task_idx)
            self.tools = await self._call("GET", self.path + "/tools?as=mcp")
        except EnvfarmError as exc:
            return observation("reset_error", error=error_message(exc, args.scenario), exc=exc)
        bundle = self.api.catalog[env]
        self.task_idx = self.lease["task_idx"] if self.lease else None
        self.task = args.task if args.task is not None else (
            bundle.tasks[self.task_idx] if self.task_idx is not None else None)
        self.episode_id = args.episode_id or str(uuid.uuid4())
        self.step_count = 0
        return observation("reset_ok", scenario=env, task=self.task, task_idx=self.task_idx,
                           has_verifier=self._has_verifier(), num_tools=len(self.tools))

    async def _open(self, env: str, task_idx: int | None) -> None:
        """This session's lease for ``env``: its own reset when it has one there (same env,
        same task), else a new one (the old one given back)."""
        if self.lease is not None and self.lease["env"] == env \
                and self.lease["task_idx"] == task_idx:
            try:
                await self._call("POST", self.path + "/reset")
                return
            except EnvfarmError:
                pass  # lost meanwhile: make a new one
        await self.release()
        self.lease = await self._call("POST", f"/envs/{env}/leases", {"task_idx": task_idx},
                                      lease=False)

    async def _attach(self, env: str, lease_id: str, token: str, task_idx: int | None
                      ) -> None:
        """Take over a lease made elsewhere (a fork, whose task ``fork`` returned), as it
        is (no reset), once its token proved right; this session's lease is given back."""
        await self._call("GET", f"/envs/{env}/leases/{lease_id}/tools", token=token)
        await self.release()
        self.lease = {"env": env, "lease_id": lease_id, "token": token, "task_idx": task_idx}

    def _has_verifier(self) -> dict[str, bool] | None:
        if self.lease is None or self.task_idx is None:
            return None
        bundle = self.api.catalog[self.lease["env"]]
        found = {"sql": self.task_idx in bundle.verifiers,
                 "code": self.task_idx in bundle.code_verifiers}
        return found if any(found.values()) else None

    # -- steps -----------------------------------------------------------------------------
    async def step(self, action: Action) -> dict[str, Any]:
        if self.done:
            return observation("episode_already_done", done=True,
                               error="Episode has ended. Call reset() to start a new episode.")
        self.step_count += 1
        if isinstance(action, ListTools):
            if self.lease is None:
                return {"tools": [], "error": "No scenario is running. Call reset() first."}
            return {"tools": [_mcp_tool(t) for t in self.tools], "error": None}
        if action.tool_name == LIST_SCENARIOS:
            scenarios = list_scenarios(self.api.catalog, self.api.served())
            return observation("tool_call_ok", scenarios=scenarios, total=len(scenarios))
        if self.lease is None:
            return observation("server_error", reward=self._reward("server_error"),
                               tool_name=action.tool_name,
                               error="No scenario is running. Call reset() first.")
        try:
            return await self._hidden_or_call(action)
        except EnvfarmError as exc:  # the lease is gone (410), the farm refused (429) ...
            if exc.kind.value == "gone":
                self.lease = None
            return observation("server_error", reward=self._reward("server_error"),
                               tool_name=action.tool_name, error=error_message(exc), exc=exc)

    async def _hidden_or_call(self, action: CallTool) -> dict[str, Any]:
        if action.tool_name == VERIFY:
            return await self._verify(action.arguments)
        if action.tool_name == DONE:
            return await self._done()
        if action.tool_name == FORK:
            info = await self._call("POST", self.path + "/fork", {})
            return observation("tool_call_ok", tool_name=FORK, tool_result={
                k: info[k] for k in ("lease_id", "token", "env", "task_idx", "forked_from")})
        if action.tool_name not in {t["name"] for t in self.tools}:
            unknown = AgentError(f"unknown tool {action.tool_name!r}")
            return observation("tool_not_found", reward=self._reward("tool_not_found"),
                               tool_name=action.tool_name, error=f"agent_error: {unknown}",
                               exc=unknown)
        res = await self._call("POST", self.path + "/call",
                               {"tool": action.tool_name, "arguments": action.arguments})
        if res.get("ok"):
            return observation("tool_call_ok", reward=self._reward("tool_call_ok"),
                               tool_name=action.tool_name,
                               tool_result=json.dumps(res.get("result"), default=str))
        error = res.get("error") or {"kind": "env_error", "message": "?"}
        kind = tool_error_type(error["kind"], error["message"])
        return observation(kind, reward=self._reward(kind), tool_name=action.tool_name,
                           error=f"{error['kind']}: {error['message']}",
                           exc=(AgentError if error["kind"] == "agent_error"
                                else EnvCallError)(error["message"]))

    async def _verify(self, arguments: dict[str, Any]) -> dict[str, Any]:
        mode = arguments.get("verifier_mode", "code")
        where = {"scenario": self.lease["env"], "task": self.task, "task_idx": self.task_idx}
        if mode not in ("code", "sql"):
            return observation("invalid_args", reward=self._reward("invalid_args"),
                               error=f"Invalid verifier_mode {mode!r}. Must be one of: code, sql")
        if self.task_idx is None:
            return observation("no_verifier", reward=self._reward("no_verifier"),
                               error="Cannot verify: no task specified at reset")
        if not (self._has_verifier() or {}).get(mode):
            return observation("no_verifier", reward=self._reward("no_verifier"), **where,
                               error=f"No {mode} verifier available for this task")
        final_answer = arguments.get("final_answer")
        verdict = await self._call("POST", self.path + "/verify", {
            "task_idx": self.task_idx,
            "final_answer": None if final_answer is None else str(final_answer)})
        return observation(verdict_type(verdict["outcome"], mode), reward=verdict["reward"],
                           verify_result=verdict, steps_taken=self.step_count, **where)

    async def _done(self) -> dict[str, Any]:
        where = {"scenario": self.lease["env"], "task": self.task, "task_idx": self.task_idx}
        await self.release()
        self.done = True
        return observation("episode_done", done=True, reward=0.0,
                           steps_taken=self.step_count, **where)

    def _reward(self, reward_type: str) -> float:
        return step_reward(reward_type, self.reward_config)

    def state(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.step_count,
                "scenario": self.lease["env"] if self.lease else None,
                "lease_id": self.lease["lease_id"] if self.lease else None}


def _mcp_tool(spec: dict[str, Any]) -> dict[str, Any]:
    """A tool as OpenEnv lists it (``input_schema``)."""
    return {"name": spec["name"], "description": spec.get("description") or "",
            "input_schema": spec.get("input_schema") or {}}


class InProcessLeaseAPI:
    """The lease API of a farm app in this process (``--no-ray``, a pool replica): requests
    go through the app itself (its limits and middleware), without a socket."""

    def __init__(self, core: FarmCore, app: ASGIApp) -> None:
        self.core = core
        self.app = app

    @property
    def catalog(self) -> Catalog:
        return self.core.catalog

    def served(self) -> list[str]:
        return self.core.env_names()

    def identify(self, key: str | None) -> str:
        return self.core.tenants.identify(key)

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        path, _, query = path.partition("?")
        raw = b"" if body is None else json.dumps(body).encode()
        pairs = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        if raw:
            pairs += [(b"content-type", b"application/json"),
                      (b"content-length", str(len(raw)).encode())]
        status, _, out = await call_asgi(self.app, method, path, query.encode(), pairs, raw)
        return status, out


def install_socket(app: Starlette, core: FarmCore) -> None:
    """``/ws`` on a farm's app, over that app's own lease API."""
    api = InProcessLeaseAPI(core, app)

    async def socket(websocket: WebSocket) -> None:
        await serve_socket(websocket, api)

    app.router.routes.append(WebSocketRoute(OPENENV_PATH, socket))


# -- the socket ------------------------------------------------------------------------------
def connection_key(websocket: WebSocket) -> str | None:
    """The tenant key a connection carries: the header, else the ``key`` query parameter (for
    clients that send no headers, openenv-core's among them)."""
    return websocket.headers.get(KEY_HEADER) or websocket.query_params.get("key") or None


async def serve_socket(websocket: WebSocket, api: LeaseAPI) -> None:
    """One OpenEnv session on ``websocket``: answer messages in order, release the lease
    however the socket ends. A missing or wrong tenant key is refused as OpenEnv's servers
    refuse a session (an ``error`` message, then the socket closes): no lease is made."""
    await websocket.accept()
    key = connection_key(websocket)
    try:
        api.identify(key)
    except EnvfarmError as exc:
        await _refuse(websocket, exc)
        return
    session = Session(api, key)
    try:
        while True:
            text = await websocket.receive_text()
            reply = await _answer(session, text)
            if reply is None:
                break
            await websocket.send_text(json.dumps(reply, default=str))
    except WebSocketDisconnect:
        pass
    finally:
        # Its own task: a server that cancels the handler when the client goes (Serve does)
        # must not cancel the release with it.
        release = asyncio.get_running_loop().create_task(session.release())
        _RELEASING.add(release)
        release.add_done_callback(_RELEASING.discard)
        try:
            await asyncio.shield(release)
        finally:
            await _close(websocket)


async def _refuse(websocket: WebSocket, exc: EnvfarmError) -> None:
    """Send the refusal, then close once the client spoke (its first request reads the
    refusal as its answer; closing at once would turn that into a bare "connection closed")
    or after ``REFUSAL_WAIT_S``."""
    try:
        await websocket.send_text(json.dumps(_farm_error(exc.kind.value.upper(), exc)))
        async with asyncio.timeout(REFUSAL_WAIT_S):
            await websocket.receive_text()
    except (WebSocketDisconnect, TimeoutError):
        pass
    await _close(websocket, 1008)  # policy violation


async def _close(websocket: WebSocket, code: int = 1000) -> None:
    try:
        await websocket.close(code)
    except (RuntimeError, WebSocketDisconnect):
        pass  # closed already, or the client is gone


async def _answer(session: Session, text: str) -> dict[str, Any] | None:
    """The reply to one message (None: the client said ``close``)."""
    if len(text) > MAX_MESSAGE_BYTES:
        return _error("VALIDATION_ERROR", f"message over {MAX_MESSAGE_BYTES} bytes")
    try:
        message = json.loads(text)
    except ValueError as exc:
        return _error("INVALID_JSON", f"Invalid JSON: {exc}")
    if not isinstance(message, dict):
        return _error("VALIDATION_ERROR", "a message is a JSON object")
    kind, data = message.get("type", ""), message.get("data")
    try:
        if kind == "reset":
            obs = await session.reset(data if isinstance(data, dict) else {})
        elif kind == "step":
            obs = await session.step(Action.validate_python(data))
        elif kind == "state":
            return {"type": "state", "data": session.state()}
        elif kind == "close":
            return None
        else:
            return _error("UNKNOWN_TYPE", f"Unknown message type: {kind}")
    except ValidationError as exc:
        return _error("VALIDATION_ERROR", "Invalid message",
                      errors=json.loads(exc.json(include_url=False)))
    except EnvfarmError as exc:
        return _farm_error("EXECUTION_ERROR", exc)
    return {"type": "observation", "data": {
        "observation": {k: v for k, v in obs.items() if k not in ("reward", "done")},
        "reward": obs.get("reward"), "done": bool(obs.get("done", False))}}


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def _farm_error(code: str, exc: EnvfarmError) -> dict[str, Any]:
    """An ``error`` message for a farm error: its kind, class and fields beside the code."""
    return _error(code, exc.message, **{k: v for k, v in exc.to_dict().items()
                                         if k != "message"})
