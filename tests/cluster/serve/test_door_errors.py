"""The Door answers every failure in its own code as a typed JSON error, never Serve's bare 500
(which clients cannot tell from an ingress that gave up). No Ray: the pool's handle here is a
stand-in whose calls fail as a broken Serve or Ray might."""

from __future__ import annotations

import json

from starlette.requests import Request

from cluster.serve._door import Door


class _Method:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def _raise(self):
        raise self.exc

    def remote(self, *args, **kwargs):
        return self._raise()


class _BrokenPool:
    """A deployment handle whose every call raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.forward = self.listener = _Method(exc)


def _request(method: str, path: str, body: bytes = b"") -> Request:
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"content-type", b"application/json")],
             "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
             "root_path": "", "http_version": "1.1"}
    return Request(scope, receive)


async def test_an_unexpected_failure_is_a_typed_json_500_and_is_logged(caplog):
    door = Door(_BrokenPool(RuntimeError("router exploded")), max_body_bytes=1 << 20)
    for method, path in [("POST", "/envs/hotel_booking_1/leases"),
                         ("POST", "/envs/hotel_booking_1/leases/abc123-xyz/call")]:
        res = await door(_request(method, path, b'{"tool": "x"}'))
        error = json.loads(res.body)["error"]
        assert res.status_code == 500 and res.media_type == "application/json"
        assert error["kind"] == "internal" and "Door failed" in error["message"]
    failures = [r for r in caplog.records if "the Door failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)
    assert not any("abc123" in r.getMessage() for r in failures)  # paths carry credentials


async def test_an_oversized_body_is_refused_before_any_hop():
    door = Door(_BrokenPool(AssertionError("no hop expected")), max_body_bytes=8)
    res = await door(_request("POST", "/envs/hotel_booking_1/leases", b"x" * 9))
    assert res.status_code == 413 and json.loads(res.body)["error"]["type"] == "PayloadTooLarge"
