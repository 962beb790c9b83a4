"""Capability MCP URLs: a lease's MCP endpoint with its credential in the path.

Some MCP clients can only be given a URL (AWM's ``awm agent --mcp_url URL`` sends no headers),
so a lease's ``mcp_url`` is absolute and ends in ``/mcp/<credential>``. The credential is
derived from the lease token (a keyed hash), so it names this lease only, cannot be turned back
into the token, and opens the MCP endpoint only: verify, snapshot and release still need the
token. The bearer header on ``…/mcp`` keeps working. Paths holding a credential are redacted by
``redact_path`` wherever the farm could log them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re

_MCP_CREDENTIAL = re.compile(r"(/mcp/)[A-Za-z0-9_\-]+")


def mcp_credential(token: str) -> str:
    digest = hmac.new(token.encode(), b"envfarm-mcp-capability", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def credential_matches(token: str, credential: str) -> bool:
    return hmac.compare_digest(mcp_credential(token).encode(), credential.encode())


def mcp_path(env: str, lease_id: str, token: str) -> str:
    return f"/envs/{env}/leases/{lease_id}/mcp/{mcp_credential(token)}"


def redact_path(text: str) -> str:
    """``…/mcp/<credential>`` -> ``…/mcp/<redacted>``."""
    return _MCP_CREDENTIAL.sub(r"\1<redacted>", text)


class RedactCredentials(logging.Filter):
    """Drops MCP credentials from log records (access logs print request paths)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "/mcp/" in str(record.msg):
            record.msg = redact_path(str(record.msg))
        if isinstance(record.args, tuple):
            record.args = tuple(_redact(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redact(v) for k, v in record.args.items()}
        for key, value in list(vars(record).items()):  # structured extras (Serve's route, ...)
            if key not in ("msg", "args"):
                setattr(record, key, _redact(value))
        return True


def _redact(value: object) -> object:
    return redact_path(value) if isinstance(value, str) and "/mcp/" in value else value
