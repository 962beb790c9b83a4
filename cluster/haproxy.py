"""What the Serve HAProxy in front of a running farm serves with: its live config and its
per-server counters (``show stat`` on its admin socket).

For an operator asking why calls queue or fail (is a server marked down? does traffic go through
Serve's Python-proxy fallback?), and for the test and the soak that check the farm's HAProxy
tuning (``envfarm/serve/_ingress.py``). Serve writes each HAProxy's files under
``/tmp/haproxy-serve/<node id>/`` (or ``$RAY_SERVE_HAPROXY_SERVER_STATE_BASE``) on its node;
the port a farm's URL names picks the HAProxy.

    python -c "from cluster.haproxy import haproxy_servers as s; print(s('http://127.0.0.1:8000'))"
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _root() -> str:
    """Serve's folder, or the one a farm moved it to (``envfarm/serve/_ingress.py``)."""
    return os.environ.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", "/tmp/haproxy-serve")


def haproxy_servers(url: str, root: str | None = None) -> dict[str, dict[str, str]]:
    """Per-server counters of the Serve HAProxy that listens at ``url`` (``show stat`` on its
    admin socket): ``backend/server`` -> stot (sessions), smax, status, chkdown, hrsp_5xx."""
    text = haproxy_config(url, root)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(text.split("stats socket ", 1)[1].split()[0])
        s.sendall(b"show stat\n")
        raw = b"".join(iter(lambda: s.recv(65536), b"")).decode()
    header, *rows = [line for line in raw.splitlines() if line]
    names = header.lstrip("# ").split(",")
    keep = ("stot", "smax", "status", "chkdown", "hrsp_5xx")
    out = {}
    for row in rows:
        r = dict(zip(names, row.split(",")))
        if r["svname"] not in ("FRONTEND", "BACKEND"):
            out[f"{r['pxname']}/{r['svname']}"] = {k: r.get(k, "") for k in keep}
    return out


def haproxy_config(url: str, root: str | None = None) -> str:
    """The live config of the Serve HAProxy that listens at ``url``: the newest one binding its
    port (an earlier farm on the same port leaves its config behind)."""
    root = root or _root()
    port = url.rsplit(":", 1)[1]
    found = [p for p in Path(root).glob("*/haproxy.cfg")
             if f"bind 127.0.0.1:{port}\n" in p.read_text()]
    if not found:
        raise FileNotFoundError(f"no HAProxy config under {root} binds port {port}")
    return max(found, key=lambda p: p.stat().st_mtime).read_text()
