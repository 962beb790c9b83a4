"""Soak: N leases with calls flowing against the Serve farm for D seconds, one replica killed at D/2.

Each lease writes its own state (a wishlist named after it) and then reads it back call after
call (one call per HTTP request): a read that misses its own write or shows another lease's is
a wrong-state error. A lease that answers 410 is replaced by a new one. With
``--episode-calls N`` each lease is released after N reads and a new one taken (episodes, as a
trainer runs them): a lease's own log then stops growing with the run, so RSS that still grows
is not the per-lease step log (kept up to 1,000 calls a lease). Reports errors by kind,
which leases got 410 (only the killed replica's may), RSS over time per process group with a
linear slope, calls/s over time, and (run as root) HAProxy's own log of every answer by status
and termination state, as JSON and a PNG plot. ``--direct`` is ``Farm(direct=True)``'s rule:
calls and releases at the owner's listener, new leases at the front and the listeners named in
turn, a dead owner's leases asked at another listener. Not part of ``make test``.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/load/soak.py'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.load._soak_procs import GROUPS, RssLog
from benchmarks.load.bench_farm_load import ENV, auth, pct
from cluster.haproxy import haproxy_servers

RESULTS = Path(__file__).resolve().parents[1] / "results"
LEASE_NAME = re.compile(r"^[A-Za-z0-9_]+-[0-9a-f]{16}$")
#: Lease TTL beyond the traffic's duration (acquiring 1,024 leases takes up to a minute or two).
TTL_MARGIN_S = 900.0


class Soak:
    """The traffic and everything it saw."""

    def __init__(self, url: str, leases: int, duration_s: float, direct: bool = False,
                 episode_calls: int | None = None, calls_only: bool = False) -> None:
        self.url, self.n, self.duration_s = url, leases, duration_s
        self.episode_calls = episode_calls  # release + a new lease after this many reads
        self.episodes = 0
        self.direct = direct  # calls to the lease's owner listener (``direct_url``), the Door skipped
        self.direct_calls = 0
        # Farm(direct=True)'s rule: new leases and a dead owner's requests at known listeners
        # too; ``calls_only``: the rule before, those through the front
        self.listener_turns = direct and not calls_only
        self.listeners: list[str] = []  # owners' listeners seen in direct_url, in order
        self.turn = self.direct_acquired = 0
        self.acquired: list[tuple[float, bool, str, float]] = []  # (t, at the front, owner, s)
        self.errors: Counter = Counter()
        self.gone_owners: Counter = Counter()
        self.per_second: Counter = Counter()
        self.latencies: list[float] = []
        self.error_samples: dict[str, list[dict]] = {}
        self.calls = 0
        self.held = 0
        self.t0 = 0.0
        self.stop = asyncio.Event()

    def _acquire_at(self) -> str:
        """Where a new lease is asked for (the SDK's rule): the front and the listeners already
        named take turns, so the farm still places a share of them by load and names new
        replicas."""
        if not self.listener_turns:
            return self.url
        self.turn = (self.turn + 1) % (len(self.listeners) + 1)
        return self.listeners[self.turn - 1] if self.turn else self.url

    async def _acquire(self, s: aiohttp.ClientSession) -> dict:
        # A TTL past the run: the default (1 h) would end every lease of a 1 h soak.
        ttl = {"ttl_s": self.duration_s + TTL_MARGIN_S}
        while True:
            at = self._acquire_at()
            t = time.monotonic()
            try:
                async with s.post(f"{at}/envs/{ENV}/leases", json=ttl) as r:
                    if r.status == 201:
                        info = await r.json()
                        if self.t0:  # when, where asked, whose, how long (after the start)
                            self.acquired.append((round(t - self.t0, 2), at == self.url,
                                                  info["lease_id"].split("-")[0],
                                                  round(time.monotonic() - t, 3)))
                        if at != self.url:
                            self.direct_acquired += 1
                            info["direct_url"] = at  # an owner does not name its own listener
                        elif (url := info.get("direct_url")) and url not in self.listeners:
                            self.listeners.append(url)
                        body = {"tool": "create_wishlist",
                                "arguments": {"name": info["lease_id"]}}
                        async with s.post(self._call_url(info), json=body,
                                          headers=auth(info)) as w:
                            if w.status == 200:
                                return info
                            self._error(w.status, await w.read(), w.content_type, "first call")
                    else:
                        self._error(r.status, await r.read(), r.content_type, "acquire")
            except aiohttp.ClientConnectorError as exc:
                if at == self.url:
                    self.errors[f"transport {type(exc).__name__}"] += 1
                elif at in self.listeners:  # that replica is gone: the front from now on
                    self.listeners.remove(at)
                    self.errors["direct acquire refused: asked the front"] += 1
                    continue
            except (TimeoutError, aiohttp.ClientError) as exc:
                self.errors[f"transport {type(exc).__name__}"] += 1
            await asyncio.sleep(0.2)

    async def _release(self, s: aiohttp.ClientSession, info: dict, front: bool) -> None:
        try:  # where its calls go (the SDK's rule)
            async with s.delete(self._lease_url(info, front), headers=auth(info)) as r:
                if r.status == 200:
                    self.episodes += 1
                else:
                    self._error(r.status, await r.read(), r.content_type, "release")
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.errors[f"transport {type(exc).__name__}"] += 1

    def _lease_url(self, info: dict, front: bool = False) -> str:
        """The lease's URL: at its owner's listener on a direct client, else the front."""
        base = info.get("direct_url") if self.direct and not front else None
        return f"{(base or self.url).rstrip('/')}/envs/{ENV}/leases/{info['lease_id']}"

    def _call_url(self, info: dict, front: bool = False) -> str:
        return self._lease_url(info, front) + "/call"

    def _error(self, status: int, body: bytes, content_type: str, where: str = "call") -> None:
        if "json" in content_type:
            try:
                kind = json.loads(body)["error"]["kind"]
            except (ValueError, KeyError, TypeError):
                kind = "unparsed"
            key = f"{status} {kind}"
        else:  # HAProxy's own error page, or Serve's bare text
            key = f"{status} non-json"
        self.errors[key] += 1
        seen = self.error_samples.setdefault(key, [])
        if len(seen) < 3:  # what the first few said, and to which request
            seen.append({"where": where, "body": body[:300].decode("utf-8", "replace")})

    def _elsewhere(self, info: dict) -> tuple[dict, bool]:
        """A lease whose owner's listener refused (the SDK's rule): another listener known
        (it hands the lease's requests on to the owner, or says 410), else the front."""
        dead = info["direct_url"]
        if dead in self.listeners:
            self.listeners.remove(dead)
        if self.listener_turns and self.listeners:
            self.errors["direct refused: asked another listener"] += 1
            return {**info, "direct_url": self.listeners[0]}, False
        self.errors["direct refused: asked the front"] += 1
        return info, True

    async def lease_loop(self, s: aiohttp.ClientSession, ready: asyncio.Event) -> None:
        info = await self._acquire(s)
        self.held += 1
        await ready.wait()
        read = {"tool": "list_wishlists"}
        front = False  # a direct lease whose owner refused the connection: asked elsewhere
        reads = 0
        while not self.stop.is_set():
            if self.episode_calls and reads >= self.episode_calls:
                await self._release(s, info, front)
                info, front, reads = await self._acquire(s), False, 0
            t = time.monotonic()
            url = self._call_url(info, front)
            try:
                async with s.post(url, json=read, headers=auth(info)) as r:
                    body = await r.read()
                    status, ctype = r.status, r.content_type
            except aiohttp.ClientConnectorError as exc:
                if self.direct and not front and info.get("direct_url"):
                    info, front = self._elsewhere(info)
                    continue
                self.errors[f"transport {type(exc).__name__}"] += 1
                await asyncio.sleep(0.2)
                continue
            except (TimeoutError, aiohttp.ClientError) as exc:
                self.errors[f"transport {type(exc).__name__}"] += 1
                await asyncio.sleep(0.2)
                continue
            if not url.startswith(self.url):
                self.direct_calls += 1
            now = time.monotonic()
            self.calls += 1
            self.per_second[int(now - self.t0)] += 1
            if self.calls % 16 == 0:
                self.latencies.append(now - t)
            if status == 200:
                reads += 1
                names = [w["name"] for w in json.loads(body)["result"]["wishlists"]
                         if LEASE_NAME.match(w["name"])]
                if names != [info["lease_id"]]:
                    self.errors["wrong_state"] += 1
                continue
            self._error(status, body, ctype)
            if status == 410:  # its replica is gone: record whose, take a new lease
                self.gone_owners[info["lease_id"].split("-")[0]] += 1
                info, front, reads = await self._acquire(s), False, 0


class HAProxyLog(asyncio.DatagramProtocol):
    """HAProxy's request log, which Serve's config sends to syslog at 127.0.0.1:514 (nobody
    listens there by default): each answer counted by status and termination state (``sQ--``:
    waited out the server queue; HAProxy's own 502/503/504 reach the client as Serve's bare-text
    500), with the first lines of each kind that is not a farm answer."""

    LINE = re.compile(rb' (\d{3}) -?\d+ \S+ \S+ (\S{4}) ')

    def __init__(self) -> None:
        self.answers: Counter = Counter()
        self.samples: dict[str, list[str]] = {}

    def datagram_received(self, data: bytes, addr) -> None:
        if (m := self.LINE.search(data)) is None:
            return
        key = f"{m[1].decode()} {m[2].decode()}"
        self.answers[key] += 1
        if m[2] != b"----" and len(seen := self.samples.setdefault(key, [])) < 3:
            seen.append(data[data.find(b"]: ") + 3:].decode("utf-8", "replace").strip()[:300])

    @classmethod
    async def listen(cls) -> HAProxyLog | None:
        try:
            _, log = await asyncio.get_running_loop().create_datagram_endpoint(
                cls, local_addr=("127.0.0.1", 514))
        except OSError:  # not root, or taken: the soak goes on without it
            return None
        return log


def only_loopback() -> bool:
    return {name for _, name in socket.if_nameindex()} <= {"lo"}


async def replicas(app: str) -> dict[str, int]:
    from ray import serve

    handle = serve.get_deployment_handle("pool", app_name=app)
    out = {}
    for i in range(8):
        who = await handle.whoami.remote(owner=f"#{i}")
        out[who["owner"]] = who["pid"]
    return out


async def run(args: argparse.Namespace, url: str, session_dir: str) -> dict:
    soak = Soak(url, args.leases, args.duration, direct=args.direct,
                episode_calls=args.episode_calls, calls_only=args.direct_calls_only)
    rss = RssLog(session_dir)
    haproxy_log = await HAProxyLog.listen()
    ready = asyncio.Event()
    conn = aiohttp.TCPConnector(limit=args.connections)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=60)) as s:
        loops = [asyncio.create_task(soak.lease_loop(s, ready)) for _ in range(args.leases)]
        t_acq = time.monotonic()
        while soak.held < args.leases:
            await asyncio.sleep(1.0)
            print(f"leases held: {soak.held}/{args.leases}", file=sys.stderr, flush=True)
        acquire_s = time.monotonic() - t_acq
        before = await replicas(f"env-{ENV}")
        victim = min(before)
        soak.t0 = rss.t0 = time.monotonic()
        ready.set()
        kill_at = args.duration / 2 if not args.no_kill else None
        killed = False
        while (elapsed := time.monotonic() - soak.t0) < args.duration:
            if kill_at is not None and not killed and elapsed >= kill_at:
                os.kill(before[victim], signal.SIGKILL)  # a replica Ray started for this run
                killed = True
            await asyncio.to_thread(rss.sample)
            print(f"t={elapsed:.0f}s calls={soak.calls} errors={dict(soak.errors)}",
                  file=sys.stderr, flush=True)
            await asyncio.sleep(max(0.0, args.sample_s - (time.monotonic() - soak.t0 - elapsed)))
        soak.stop.set()
        await asyncio.gather(*loops)
        after = await replicas(f"env-{ENV}")
    result = report(args, soak, rss, acquire_s, before, after, victim, kill_at)
    # Which server took the traffic: a replica marked down sends it to the Python-proxy fallback.
    result["haproxy_servers"] = haproxy_servers(url)
    result["haproxy_answers"] = (
        {"by_status_and_termination": dict(haproxy_log.answers.most_common()),
         "samples": haproxy_log.samples} if haproxy_log else None)
    return result


def report(args, soak: Soak, rss: RssLog, acquire_s: float, before: dict, after: dict,
           victim: str, kill_at: float | None) -> dict:
    series = [soak.per_second.get(t, 0) for t in range(int(args.duration))]
    failures = []
    # new leases' answer times by where they were asked and whose they became, before the kill
    # and in the 60 s after it (which replica is slow to make leases after a replacement)
    phases: dict[str, list[float]] = {}
    for t, front, owner, took in soak.acquired:
        phase = ("before kill" if kill_at is None or t < kill_at else
                 "60 s after kill" if t < kill_at + 60 else "later")
        role = ("killed" if owner == victim else "survivor" if owner in before else "newborn")
        phases.setdefault(f"{phase}, {'front' if front else 'listener'}, {role}", []).append(took)
    acquire_times = {k: {"n": len(v), "p50_s": round(pct(v, 0.5), 3),
                         "p90_s": round(pct(v, 0.9), 3)} for k, v in sorted(phases.items())}
    if set(soak.gone_owners) - ({victim} if kill_at is not None else set()):
        failures.append(f"410 on leases of live replicas: {dict(soak.gone_owners)}")
    if soak.errors["wrong_state"]:
        failures.append(f"{soak.errors['wrong_state']} calls saw a wrong state")
    bad = {k: v for k, v in soak.errors.items() if k[0] == "5" or k.startswith("transport")}
    if bad:
        failures.append(f"5xx/transport errors: {bad}")
    return {
        "acquire_times": acquire_times,
        "config": {"leases": args.leases, "duration_s": args.duration, "replicas": args.replicas,
                   "door_hop": args.door_hop, "direct": args.direct,
                   "direct_calls_only": args.direct_calls_only,
                   "episode_calls": args.episode_calls,
                   "connections": args.connections, "tool": "list_wishlists (reads own state)",
                   "cores": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "acquire_all_s": round(acquire_s, 1),
        "calls": soak.calls, "calls_per_s": round(soak.calls / args.duration, 1),
        "direct_calls": soak.direct_calls, "direct_acquired": soak.direct_acquired,
        "episodes_released": soak.episodes,
        "p50_ms": round(pct(soak.latencies, 0.5) * 1000, 2),
        "p99_ms": round(pct(soak.latencies, 0.99) * 1000, 2),
        "errors_by_kind": dict(soak.errors), "error_samples": soak.error_samples,
        "killed": {"owner": victim if kill_at is not None else None, "at_s": kill_at,
                   "replicas_before": sorted(before),
                   "replicas_after": sorted(after)},
        "gone_leases_by_owner": dict(soak.gone_owners),
        "rss": rss.report(kill_at), "rss_samples": {"t_s": rss.times, "mib": rss.samples},
        "calls_per_s_by_second": series,
        "ok": not failures, "failures": failures,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    series = result["calls_per_s_by_second"]
    w = 5
    smooth = [sum(series[i:i + w]) / len(series[i:i + w]) for i in range(0, len(series), w)]
    top.plot([i * w for i in range(len(smooth))], smooth)
    top.set_ylabel("calls/s (5 s mean)")
    samples = result["rss_samples"]
    for g in GROUPS:
        bottom.plot(samples["t_s"], [s[g] for s in samples["mib"]], label=g)
    bottom.set_ylabel("RSS MiB (sum per group)")
    bottom.set_xlabel("seconds")
    bottom.legend(fontsize=7, ncol=4)
    for ax in (top, bottom):
        if result["killed"]["at_s"] is not None:
            ax.axvline(result["killed"]["at_s"], color="red", linestyle="--")
    cfg = result["config"]
    at = result["killed"]["at_s"]
    killed = f"one killed at {at:.0f} s" if at is not None else "none killed"
    fig.suptitle(f"envfarm soak: {cfg['leases']} leases, {cfg['replicas']} replicas, "
                 f"{killed} ({cfg['cores']} cores)")
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leases", type=int, default=1024)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--connections", type=int, default=1024, help="client connection limit")
    p.add_argument("--no-kill", action="store_true", help="kill no replica")
    p.add_argument("--max-ongoing", type=int, default=None,
                   help="max_ongoing_requests per pool replica (default: the farm's)")
    p.add_argument("--door-hop", choices=("http", "handle"), default="http",
                   help="how the Door reaches a lease's owner (DeploymentOptions.door_hop)")
    p.add_argument("--direct", action="store_true",
                   help="send each lease's calls to its owner's listener (LeaseInfo.direct_url)")
    p.add_argument("--direct-calls-only", action="store_true",
                   help="with --direct: the rule before, new leases and a dead owner's requests "
                        "through the front (default: Farm(direct=True)'s, known listeners too)")
    p.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period")
    p.add_argument("--episode-calls", type=int, default=None,
                   help="release each lease after this many reads and take a new one")
    p.add_argument("--name", default="soak", help="results/<name>.json and .png")
    args = p.parse_args()
    if not only_loopback():
        sys.exit("run inside a private network namespace: "
                 "unshare --net sh -c 'ip link set lo up && exec python benchmarks/load/soak.py'")
    import ray

    from cluster.serve import DeploymentOptions, ServeOptions, start_farm
    from envfarm.farm import FarmConfig, PoolConfig, free_port

    ongoing = {} if args.max_ongoing is None else {"max_ongoing_requests": args.max_ongoing}
    farm = start_farm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=8)),
                      ServeOptions(port=free_port(), num_cpus=2,
                                   deployment=DeploymentOptions(num_replicas=args.replicas,
                                                                door_hop=args.door_hop,
                                                                **ongoing)))
    try:
        session = ray._private.worker._global_node.get_session_dir_path()
        result = asyncio.run(run(args, farm.url, session))
    finally:
        farm.shutdown()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    plot(result, RESULTS / f"{args.name}.png")
    brief = {k: result[k] for k in ("calls", "calls_per_s", "p50_ms", "p99_ms", "errors_by_kind",
                                    "gone_leases_by_owner", "ok", "failures")}
    print(json.dumps(brief, indent=1))
    print(json.dumps({g: r["slope_whole_mib_per_min"] for g, r in result["rss"].items()}))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
