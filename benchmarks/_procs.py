"""Process helpers the benchmarks share."""

from __future__ import annotations

import time


def wait_http(url: str, timeout_s: float = 120.0) -> None:
    """Until ``url`` answers below 500 (a farm or server that is up), or RuntimeError."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")
