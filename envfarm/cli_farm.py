"""`envfarm serve`, `envfarm demo` and `envfarm lease ...`: run the farm and poke at it.

Mount on the root app with ``register(app)``. Ray is imported only by commands that start it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from envfarm.catalog import load_catalog
from envfarm.client import EpisodeReport, Farm, reference_episode
from envfarm.compose import LocalFarm, compose_core
from envfarm.errors import EnvfarmError
from envfarm.farm import (
    FarmConfig,
    PoolConfig,
    QuarantineConfig,
    Tenant,
    TenantsConfig,
    hash_key,
    is_loopback,
    load_tenants,
    make_server,
    new_key,
    with_environ_tenants,
)

console = Console(soft_wrap=True)

CatalogOpt = Annotated[Path | None, typer.Option(
    "--catalog", help="Catalog folder (AWM JSONL files); default: the bundled catalog.")]
EnvsOpt = Annotated[str | None, typer.Option(
    "--envs", help="Comma-separated env names to serve; default: every servable env.")]
HostOpt = Annotated[str, typer.Option("--host", help="Bind address (loopback by default).")]
PortOpt = Annotated[int, typer.Option("--port", help="HTTP port.")]


class Ingress(str, Enum):
    haproxy = "haproxy"
    python = "python"


ProxyOpt = Annotated[Ingress, typer.Option(
    "--proxy", help="Serve's HTTP ingress: haproxy (straight to replicas; its replica ports "
                    "bind all interfaces) or python (Serve's Python proxy, one more hop).")]


InProcessOpt = Annotated[bool, typer.Option(
    "--in-process", help="Run env code in the serving process (trusted catalogs only; the "
                         "baseline of the benchmarks). Default: confined worker processes.")]
UnconfinedOpt = Annotated[bool, typer.Option(
    "--allow-unconfined", help="Serve through worker processes even where the kernel cannot "
                               "confine them (no seccomp/landlock); the status page says so.")]
LeasesPerWorkerOpt = Annotated[int, typer.Option(
    "--leases-per-worker", min=1, help="Instances one env worker holds (a crash loses these).")]


OnDemandOpt = Annotated[bool | None, typer.Option(
    "--on-demand/--eager", help="Load env types at their first lease and evict idle ones, or "
                                "all at start. Default: on demand above 16 types.")]
HotOpt = Annotated[str | None, typer.Option(
    "--hot", help="Comma-separated types loaded at start and never evicted (on demand).")]
EvictIdleOpt = Annotated[float, typer.Option(
    "--evict-idle", min=1, help="Seconds without a lease before a loaded type is evicted.")]
MaxLoadedOpt = Annotated[int, typer.Option(
    "--max-loaded", min=1, help="Most env types loaded at once (on demand; per process or "
                                "replica): one more evicts the least recently used idle type.")]
TenantsOpt = Annotated[Path | None, typer.Option(
    "--tenants", envvar="ENVFARM_TENANTS",
    help="Tenants file (YAML: name, key_sha256, max_leases, leases_per_s, calls_per_s); "
         "`envfarm tenants new` writes one.")]
ApiKeyOpt = Annotated[list[str] | None, typer.Option(
    "--api-key", help="NAME:KEY of a tenant (no quota; repeatable). Prefer the tenants file or "
                      "$ENVFARM_API_KEYS (NAME:KEY,...): a command line is visible to others.")]


QuarantineShareOpt = Annotated[float, typer.Option(
    "--quarantine-share", min=0.0, max=1.0,
    help="Take a task (or env type) out of rotation when over this share of its tool calls fail "
         "on the env's side, or of its verifications give no verdict, in the window "
         "(docs/integrity.md); 1 never does.")]
QuarantineWindowOpt = Annotated[float, typer.Option(
    "--quarantine-window", min=1.0, help="Seconds the quarantine counts over.")]


def _names(text: str | None) -> list[str] | None:
    return [e.strip() for e in text.split(",") if e.strip()] if text else None


def _config(catalog: Path | None, envs: str | None, warm: int,
            tenants: TenantsConfig | None = None, in_process: bool = False,
            allow_unconfined: bool = False, leases_per_worker: int = 64,
            on_demand: bool | None = None, hot: str | None = None,
            evict_idle_s: float = 300.0, max_loaded: int = 128,
            quarantine: QuarantineConfig | None = None) -> FarmConfig:
    return FarmConfig(catalog=str(catalog) if catalog else None, envs=_names(envs),
                      quarantine=quarantine or QuarantineConfig(),
                      pool=PoolConfig(warm=warm), tenants=tenants or TenantsConfig(),
                      isolation="in_process" if in_process else "workers",
                      allow_unconfined=allow_unconfined, leases_per_worker=leases_per_worker,
                      on_demand=on_demand, hot=_names(hot) or [], evict_idle_s=evict_idle_s,
                      max_loaded_types=max_loaded)


def tenants_config(path: Path | None, keys: list[str] | None, host: str) -> TenantsConfig:
    """Tenants from the file, ``--api-key`` and ``$ENVFARM_API_KEYS`` (keys hashed at once);
    a key is required when the farm listens beyond loopback."""
    return with_environ_tenants(TenantsConfig(require_key=not is_loopback(host)), path, keys)


def _say_who_may_lease(tenants: TenantsConfig) -> None:
    if tenants.require_key:
        if not tenants.tenants:
            raise typer.BadParameter("the farm listens beyond loopback, where creating leases "
                                     "needs an API key: give --tenants FILE or $ENVFARM_API_KEYS "
                                     "(envfarm tenants new NAME makes a key)")
        console.print(f"leases need an API key ({len(tenants.tenants)} tenants)")
    else:
        console.print("[yellow]open farm:[/yellow] listening on loopback, anyone on this machine "
                      "may create leases without an API key"
                      + (f" ({len(tenants.tenants)} tenants have keys)" if tenants.tenants
                         else ""))


# Flags that only mean something when Ray Serve runs the farm.
RAY_ONLY = ("pack", "replicas", "num_cpus", "address", "write_config", "access_log")


def _given(ctx: typer.Context, name: str) -> bool:
    # By name: typer's Context reports its own ParameterSource enum, not click's.
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _reject_ray_flags(ctx: typer.Context) -> None:
    """`--no-ray` runs one process: a Ray flag given with it would be silently ignored."""
    given = [f"--{name.replace('_', '-')}" for name in RAY_ONLY
             if _given(ctx, name)]
    if given:
        console.print(f"[red]error:[/red] {', '.join(given)} only apply to a Ray Serve farm; "
                      "--no-ray runs one process (drop them, or drop --no-ray)")
        raise typer.Exit(2)


def serve(ctx: typer.Context, catalog: CatalogOpt = None, envs: EnvsOpt = None,
          pack: Annotated[int, typer.Option("--pack", min=1,
                                            help="Env types per deployment (small machines).")] = 1,
          no_ray: Annotated[bool, typer.Option("--no-ray",
                                               help="One uvicorn process, no Ray.")] = False,
          replicas: Annotated[int, typer.Option("--replicas", min=1,
                                                help="Replicas per deployment.")] = 1,
          warm: Annotated[int, typer.Option("--warm", min=0,
                                            help="Reset instances kept ready per env "
                                                 "and replica.")] = 8,
          num_cpus: Annotated[int | None, typer.Option("--num-cpus",
                                                          help="ray.init num_cpus.")] = None,
          address: Annotated[str | None, typer.Option(
              "--address", help="Join an existing Ray cluster (e.g. 'auto') instead of "
                                "starting an embedded one.")] = None,
          write_config: Annotated[Path | None, typer.Option(
              "--write-config", help="Write the farm as a Serve config (for `serve deploy` or "
                                     "a RayService) to this file and exit.")] = None,
          proxy: ProxyOpt = Ingress.haproxy,
          access_log: Annotated[bool, typer.Option(
              "--access-log", help="Serve's access log: one line per request (tool call) in "
                                   "each replica's log file; off by default.")] = False,
          in_process: InProcessOpt = False, allow_unconfined: UnconfinedOpt = False,
          leases_per_worker: LeasesPerWorkerOpt = 64,
          on_demand: OnDemandOpt = None, hot: HotOpt = None, evict_idle: EvictIdleOpt = 300.0,
          max_loaded: MaxLoadedOpt = 128,
          tenants: TenantsOpt = None, api_key: ApiKeyOpt = None,
          quarantine_share: QuarantineShareOpt = 0.5, quarantine_window: QuarantineWindowOpt = 600.0,
          host: HostOpt = "127.0.0.1", port: PortOpt = 8000) -> None:
    """Serve the catalog's envs over the lease API (HTTP + MCP) until Ctrl-C."""
    if no_ray:
        _reject_ray_flags(ctx)
    try:
        tenant_config = tenants_config(tenants, api_key, host)
        quarantine = QuarantineConfig(window_s=quarantine_window, max_env_error_share=quarantine_share,
                                      max_invalid_share=quarantine_share)
        config = _config(catalog, envs, warm, tenant_config, in_process, allow_unconfined,
                         leases_per_worker, on_demand, hot, evict_idle, max_loaded, quarantine)
        if write_config is None:
            _say_who_may_lease(tenant_config)
        if write_config is not None:
            _write_config(config, pack, replicas, host, port, write_config, access_log)
        elif no_ray:
            _serve_local(config, host, port)
        else:
            _serve_ray(config, pack, replicas, num_cpus, host, port, address, proxy.value,
                       access_log)
    except EnvfarmError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(2) from exc


def _serve_local(config: FarmConfig, host: str, port: int) -> None:
    core = compose_core(config)
    free = sum(s.free for s in core.pool_stats())
    types = core.registry.counts()
    console.print(f"envfarm (no Ray) listening on http://{host}:{port} — "
                  f"{types.types} envs ({types.loaded} loaded"
                  f"{', the rest on demand' if core.registry.on_demand else ''}), "
                  f"{free} instances ready; env code: {core.isolation}; Ctrl-C to stop")
    for problem in core.problems:
        console.print(f"[yellow]not served:[/yellow] {problem}")
    make_server(core, host, port).run()  # uvicorn handles Ctrl-C and shuts down cleanly


def _write_config(config: FarmConfig, pack: int, replicas: int, host: str, port: int,
                  path: Path, access_log: bool = False) -> None:
    import yaml

    from envfarm.serve import DeploymentOptions, ServeOptions
    from envfarm.serve.apps import serve_config

    options = ServeOptions(host=host, port=port, pack=pack, deployment=DeploymentOptions(
        num_replicas=replicas, access_log=access_log))
    path.write_text(yaml.safe_dump(serve_config(config, options), sort_keys=False))
    console.print(f"wrote {path}")


def _serve_ray(config: FarmConfig, pack: int, replicas: int, num_cpus: int | None, host: str,
               port: int, address: str | None = None, proxy: str = "haproxy",
               access_log: bool = False) -> None:
    from envfarm.serve import DeploymentOptions, ServeOptions, stop_within

    options = ServeOptions(host=host, port=port, pack=pack, num_cpus=num_cpus, proxy=proxy,
                           deployment=DeploymentOptions(num_replicas=replicas,
                                                        access_log=access_log))
    # Ctrl-C and SIGTERM only set a flag: a KeyboardInterrupt raised at a random point of the
    # driver could leave Ray's client half-way through a call. One during the start is acted on
    # after it (start_farm keeps this SIGTERM handler through ray.init).
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    console.print("starting Ray and Serve ..." if address is None
                  else f"joining the Ray cluster at {address} ...")
    farm, watch = _start_serve(config, options, address)
    ready = farm.instances_ready(config.pool.warm)
    console.print(f"envfarm listening on {farm.url} ({farm.proxy} ingress) — {len(farm.envs)} "
                  f"envs in {len(farm.plans)} deployments, {ready} instances ready "
                  f"(started in {farm.startup_s:.1f} s); Ctrl-C to stop")
    while not stop.wait(1.0):
        watch.look()  # Ray starts workers (and HAProxy reloads) as it goes
    console.print("shutting down ...")
    left, finished = stop_within(farm.shutdown, watch)
    console.print("stopped" + (f" (ended {len(left)} leftover processes: "
                               f"{', '.join(sorted(set(left)))})" if left else ""))
    if not finished:
        _leave_now()


def _leave_now(code: int = 0) -> None:
    """Exit at once: Ray's exit hooks would wait on the processes the stop just ended."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start_serve(config: FarmConfig, options: Any, address: str | None = None
                 ) -> tuple[Any, Any]:
    """The farm on Serve, its processes started deaf to a terminal's Ctrl-C, and a watch on
    them (see envfarm.serve._stop)."""
    from envfarm.serve import Descendants, shielded_start, start_farm

    watch = Descendants()
    farm = shielded_start(lambda: start_farm(config, options, address=address))
    watch.look()
    return farm, watch


def _pick_task(config: FarmConfig, env: str | None, task_idx: int | None
               ) -> tuple[str, int, list[Any], str | None]:
    """(env, task, reference solution, stored reference final answer) of the demo episode."""
    catalog = load_catalog(config.catalog, check_code=False)
    names = [env] if env else catalog.servable
    for name in names:
        bundle = catalog[name]
        tasks = [task_idx] if task_idx is not None else sorted(bundle.solutions)
        for idx in tasks:
            if idx in bundle.solutions and idx in bundle.code_verifiers:
                return bundle.name, idx, bundle.solutions[idx], bundle.solution_answers.get(idx)
    if env and task_idx is not None:
        return catalog[env].name, task_idx, [], None
    raise typer.BadParameter("no servable env with a reference solution and a verifier; "
                             "pass --env and --task")


def demo(catalog: CatalogOpt = None,
         env: Annotated[str | None, typer.Option("--env", help="Env of the episode.")] = None,
         task: Annotated[int | None, typer.Option("--task", help="Task index.")] = None,
         no_ray: Annotated[bool, typer.Option("--no-ray", help="Skip Ray: one process.")] = False,
         proxy: ProxyOpt = Ingress.haproxy, port: PortOpt = 8000) -> None:
    """Start the farm, run one reference episode (lease, tools, solution, verify, release), stop."""
    config = _config(catalog, None, warm=2)
    name, idx, solution, answer = _pick_task(config, env, task)
    clean = [True]  # False: a Ray stop was cut short, leave with os._exit (see _leave_now)
    if no_ray:
        local = LocalFarm(config, port=port).start()
        url, stop = local.url, local.stop
        console.print(f"farm (no Ray) up on {url} with {len(local.core.envs)} envs")
    else:
        from envfarm.serve import DeploymentOptions, ServeOptions, stop_within

        console.print("starting the farm on an embedded local Ray ...")
        early = threading.Event()  # a Ctrl-C during the start (see shielded_start)
        signal.signal(signal.SIGINT, lambda *_: early.set())
        try:
            running, watch = _start_serve(config, ServeOptions(
                port=port, num_cpus=2, proxy=proxy.value,
                deployment=DeploymentOptions(num_replicas=1)))
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        url = running.url

        def stop() -> None:
            clean[0] = stop_within(running.shutdown, watch)[1]
        console.print(f"farm up on {url} ({running.proxy} ingress) with "
                      f"{len(running.envs)} envs ({running.startup_s:.1f} s)")
    try:
        if not no_ray and early.is_set():
            raise KeyboardInterrupt
        report = asyncio.run(_demo_episode(url, name, idx, solution, answer))
    except KeyboardInterrupt:
        stop()
        console.print("interrupted")
        if not clean[0]:
            _leave_now(130)
        raise typer.Exit(130) from None
    stop()
    _print_report(report)
    if not clean[0]:
        _leave_now(0 if report.verdict.valid else 1)
    if not report.verdict.valid:
        raise typer.Exit(1)


async def _demo_episode(url: str, env: str, idx: int, solution: list[Any],
                        answer: str | None) -> EpisodeReport:
    async with Farm(url) as farm:
        return await reference_episode(farm, env, idx, solution, answer)


def _print_report(r: EpisodeReport) -> None:
    console.print(f"\n[bold]episode[/bold] env={r.env} task={r.task_idx} lease={r.lease_id}")
    console.print(f"  task: {r.task}")
    console.print(f"  tools listed: {r.tools}")
    for i, step in enumerate(r.steps, 1):
        mark = "[green]ok[/green]" if step.ok else "[red]error[/red]"
        console.print(f"  {i}. {step.tool} {mark} {step.summary}")
    v = r.verdict
    console.print(f"  verify: outcome={v.outcome.value} reward={v.reward} valid={v.valid}")
    console.print(f"  release: {r.release}   ({r.seconds * 1000:.0f} ms)")


# -- envfarm lease ... ----------------------------------------------------------------------------
lease_app = typer.Typer(help="Poke at a running farm by hand: lease, tools, call, verify, release.",
                        no_args_is_help=True)
UrlOpt = Annotated[str, typer.Option("--url", envvar="ENVFARM_URL", help="Farm URL.")]
LeaseOpt = Annotated[str, typer.Option("--lease", envvar="ENVFARM_LEASE", help="Lease id.")]
TokenOpt = Annotated[str, typer.Option("--token", envvar="ENVFARM_TOKEN", help="Lease token.")]
EnvOpt = Annotated[str, typer.Option("--env", envvar="ENVFARM_ENV", help="Env of the lease.")]


def _run(coro_fn: Any, url: str) -> Any:
    async def main() -> Any:
        async with Farm(url, retries=1) as farm:
            return await coro_fn(farm)
    try:
        return asyncio.run(main())
    except EnvfarmError as exc:
        console.print(f"[red]{type(exc).__name__}:[/red] {exc.message}")
        raise typer.Exit(1) from exc


def _lease(farm: Farm, env: str, lease_id: str, token: str) -> Any:
    from envfarm.client import Lease
    from envfarm.farm import LeaseInfo

    return Lease(farm, LeaseInfo(lease_id=lease_id, env=env, token=token, expires_at=0,
                                 idle_timeout_s=0, mcp_url=""))


def _emit(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


@lease_app.command("envs")
def lease_envs(url: UrlOpt = "http://127.0.0.1:8000") -> None:
    """List the farm's envs."""
    _emit([e.model_dump() for e in _run(lambda f: f.envs(), url)])


@lease_app.command("create")
def lease_create(env: Annotated[str, typer.Argument(help="Env name.")],
                 task: Annotated[int | None, typer.Option("--task")] = None,
                 ttl: Annotated[float | None, typer.Option("--ttl")] = None,
                 url: UrlOpt = "http://127.0.0.1:8000") -> None:
    """Take a lease; prints its id and token (export ENVFARM_LEASE / ENVFARM_TOKEN)."""
    lease = _run(lambda f: f.acquire(env, task_idx=task, ttl_s=ttl), url)
    _emit(lease.info.model_dump())


@lease_app.command("tools")
def lease_tools(env: EnvOpt, lease: LeaseOpt, token: TokenOpt,
                url: UrlOpt = "http://127.0.0.1:8000") -> None:
    """List the lease's tools."""
    tools = _run(lambda f: _lease(f, env, lease, token).tools(), url)
    _emit([{"name": t.name, "description": t.description} for t in tools])


@lease_app.command("call")
def lease_call(tool: Annotated[str, typer.Argument(help="Tool name.")],
               arguments: Annotated[str, typer.Argument(help="JSON object of arguments.")] = "{}",
               env: EnvOpt = "", lease: LeaseOpt = "", token: TokenOpt = "",
               url: UrlOpt = "http://127.0.0.1:8000") -> None:
    """Call a tool with JSON arguments."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"arguments are not JSON: {exc.msg}") from exc
    res = _run(lambda f: _lease(f, env, lease, token).call_result(tool, args), url)
    _emit(res.model_dump())


@lease_app.command("verify")
def lease_verify(env: EnvOpt, lease: LeaseOpt, token: TokenOpt,
                 task: Annotated[int | None, typer.Option("--task")] = None,
                 url: UrlOpt = "http://127.0.0.1:8000") -> None:
    """Run the task's verifier on the lease's state."""
    _emit(_run(lambda f: _lease(f, env, lease, token).verify(task), url).model_dump())


@lease_app.command("release")
def lease_release(env: EnvOpt, lease: LeaseOpt, token: TokenOpt,
                  url: UrlOpt = "http://127.0.0.1:8000") -> None:
    """Release the lease (idempotent)."""
    _emit(_run(lambda f: _lease(f, env, lease, token).release(), url).model_dump())


# -- envfarm tenants ... --------------------------------------------------------------------------
tenants_app = typer.Typer(help="Farm API keys and quotas of a shared farm.", no_args_is_help=True)


@tenants_app.command("new")
def tenants_new(name: Annotated[str, typer.Argument(help="Tenant name.")],
                file: Annotated[Path, typer.Option("--file", help="Tenants file to add to "
                                                   "(created if missing).")] = Path(
                                                       "tenants.yaml"),
                max_leases: Annotated[int | None, typer.Option("--max-leases", min=0)] = None,
                leases_per_s: Annotated[float | None, typer.Option("--leases-per-s")] = None,
                calls_per_s: Annotated[float | None, typer.Option("--calls-per-s")] = None
                ) -> None:
    """Make a tenant's API key: prints the key once; the file keeps only its SHA-256."""
    import yaml

    tenants = load_tenants(file) if file.exists() else []
    if any(t.name == name for t in tenants):
        raise typer.BadParameter(f"{file} has a tenant {name!r} already")
    key = new_key()
    try:
        tenant = Tenant(name=name, key_sha256=hash_key(key), max_leases=max_leases,
                        leases_per_s=leases_per_s, calls_per_s=calls_per_s)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    items = [t.model_dump(exclude_none=True, exclude_defaults=True) | {
        "name": t.name, "key_sha256": t.key_sha256} for t in [*tenants, tenant]]
    tmp = file.with_suffix(file.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump({"tenants": items}, sort_keys=False))
    os.chmod(tmp, 0o600)
    tmp.replace(file)
    sys.stdout.write(key + "\n")
    Console(stderr=True).print(f"added tenant {name!r} to {file}; give the key above to the "
                               "tenant (ENVFARM_API_KEY): it is not stored")


def register(app: typer.Typer) -> None:
    """Mount ``serve``, ``demo``, ``lease`` and ``tenants`` on the root CLI."""
    app.command("serve")(serve)
    app.command("demo")(demo)
    app.add_typer(lease_app, name="lease")
    app.add_typer(tenants_app, name="tenants")
