"""The farm's address for OpenEnv clients (openenv-core's ``MCPToolClient``, OpenEnv's ``AWMEnv``).

Those clients connect to ``base_url + "/ws"`` and send no headers, so a farm that needs a tenant
key gets it in the query: the ``base_url`` below ends in a parameter of its own, where the
client's appended ``/ws`` lands, and the farm reads ``key``.
"""

from __future__ import annotations

from urllib.parse import quote


def openenv_base_url(url: str = "http://127.0.0.1:8000", key: str | None = None) -> str:
    """The ``base_url`` to give an OpenEnv client for the farm at ``url`` (with ``key``, the
    tenant's farm API key, where the farm needs one)."""
    url = url.rstrip("/")
    if not key:
        return url
    return f"{url}/ws?key={quote(key, safe='')}&then="
