"""RESULTS.md's Farm tables, rendered from one bench_farm.py run's JSON."""

from __future__ import annotations


def render_markdown(res: dict) -> str:
    """The tables of RESULTS.md's Farm section, from one run's JSON."""
    nr, sv, awm, sq = res["no_ray"], res["serve"], res["awm"], res["sequential"]
    k = res["settings"]["no_ray_procs_equal"]
    eq = res.get(f"no_ray_x{k}") or {}

    def row(name: str, r: dict, note: str = "", ceiling: bool = False) -> str:
        mark = "**" if ceiling else ""
        return (f"| {name} | {mark}{r['calls_per_s']:,.0f}{mark} | {r['p50_ms']:g} | "
                f"{r['p99_ms']:g} | {', '.join(f'{x:,.0f}' for x in r['runs_calls_per_s'])} "
                f"| {note} |")

    labels = {"http_calls": ("HTTP, 32 leases", "one call per request"),
              "batched_calls": ("owner batch x64", "one hop; latency per batch"),
              "batched_front": ("front batch x64 (`/batch/call`)", "latency per batch"),
              "mcp_calls": ("MCP tools/call, 32 leases", "")}
    lines = ["| path (same run, interleaved) | calls/s (median round) | p50 ms | p99 ms "
             "| every round, calls/s | notes |", "|---|---|---|---|---|---|"]
    for mode, (name, note) in labels.items():
        lines.append(row(f"--no-ray, 1 process, {name}", nr[mode],
                         note + ("; **the 1-process ceiling**" if mode == res["ceiling_mode"]
                                 else ""), mode == res["ceiling_mode"]))
    for mode, (name, note) in labels.items():
        if eq:
            is_ceiling = mode == res.get("ceiling_equal_mode")
            lines.append(row(f"--no-ray, {k} processes, {name}", eq[mode],
                             note + (f"; **the {k}-process ceiling**" if is_ceiling else ""),
                             is_ceiling))
    for mode, (name, note) in labels.items():
        lines.append(row(f"Serve ({res['settings']['replicas']} replicas), {name}", sv[mode],
                         note))
    lines.append(row("Serve, in-cluster DeploymentHandles, batch x64", sv["handles"],
                     "no HTTP proxy"))
    lines.append(row(f"AWM: {awm['instances']} uvicorn processes + DB files", awm["calls"],
                     "one call per request"))
    lines += ["", "| ratio (median rounds) | value |", "|---|---|"]
    lines += [f"| {name} | {v} |" for name, v in res["ratios"].items()]
    lines += [
        "",
        "| sequential latency (interleaved rounds) | p50 ms | p99 ms |",
        "|---|---|---|",
        f"| --no-ray lease acquire (HTTP) | {sq['no_ray_lease_acquire']['p50_ms']} | "
        f"{sq['no_ray_lease_acquire']['p99_ms']} |",
        f"| Serve lease acquire (HTTP) | {sq['serve_lease_acquire']['p50_ms']} | "
        f"{sq['serve_lease_acquire']['p99_ms']} |",
        f"| Serve's floor: trivial FastAPI ingress GET | {sq['serve_floor_get']['p50_ms']} | "
        f"{sq['serve_floor_get']['p99_ms']} |",
        f"| Serve farm /healthz | {sq['serve_healthz']['p50_ms']} | "
        f"{sq['serve_healthz']['p99_ms']} |",
        f"| --no-ray /healthz | {sq['no_ray_healthz']['p50_ms']} | "
        f"{sq['no_ray_healthz']['p99_ms']} |",
        f"| Serve `leases:batch` x16, per lease | "
        f"{sv['lease_acquire_batch16']['per_lease_p50_ms']} | - |",
        f"| Serve in-cluster handle acquire | {sv['handle_lease_acquire']['p50_ms']} | "
        f"{sv['handle_lease_acquire']['p99_ms']} |",
        "",
        (f"| {res['settings']['hold']:,} leases held, calls flowing | total RSS MiB "
         "| total PSS MiB | processes | calls/s |"),
        "|---|---|---|---|---|",
    ]
    for name, h in (("--no-ray (one process)", nr["hold"]),
                    ("Serve (all Ray processes)", sv["hold"])):
        m = h["memory"]
        lines.append(f"| {name} | {m['rss_mib']:,.0f} | {m['pss_mib']:,.0f} | "
                     f"{m['processes']} | {h['flow']['calls_per_s']:,.0f} |")
    am = awm["memory"]
    lines.append(f"| AWM, {awm['instances']} instances (measured, idle) | {am['rss_mib']:,.0f} | "
                 f"{am['pss_mib']:,.0f} | {am['processes']} | - |")
    lines.append(f"| AWM, 1,024 instances (extrapolated) | - | "
                 f"{awm['extrapolated_1024_gib'] * 1024:,.0f} | 1,024 | - |")
    lines += ["", ("| locust, 20 users, lease -> 20 calls -> release | req/s | p50 ms | p99 ms |"
              " failures |"), "|---|---|---|---|---|"]
    for name, lo in (("--no-ray", nr["locust"]), ("Serve", sv["locust"])):
        a = lo["all"]
        lines.append(f"| {name} | {a['req_per_s']} | {a['p50_ms']:g} | {a['p99_ms']:g} |"
                     f" {a['failures']} |")
    return "\n".join(lines)
