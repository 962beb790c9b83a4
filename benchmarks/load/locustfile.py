"""Locust load for the farm: lease -> tool calls -> release, over and over.

Run headless, bounded, against loopback only, e.g.:
    locust -f benchmarks/load/locustfile.py --headless -u 20 -r 20 -t 15s --host http://127.0.0.1:8000
ENVFARM_ENV picks the env (default hotel_booking_1); ENVFARM_CALLS the calls per lease.
"""

from __future__ import annotations

import os

from locust import FastHttpUser, between, task

ENV = os.environ.get("ENVFARM_ENV", "hotel_booking_1")
CALLS_PER_LEASE = int(os.environ.get("ENVFARM_CALLS", "20"))
TOOLS = [("get_my_profile", {}), ("list_wishlists", {}), ("list_payment_methods", {})]


class Trainer(FastHttpUser):
    """One rollout worker: holds a lease, calls tools, releases it and takes a new one."""

    wait_time = between(0, 0)

    def on_start(self) -> None:
        self.lease: dict | None = None
        self.calls = 0
        self._acquire()

    def _acquire(self) -> None:
        with self.client.post(f"/envs/{ENV}/leases", json={}, name="lease",
                              catch_response=True) as r:
            if r.status_code != 201:
                r.failure(f"lease: HTTP {r.status_code}")
                self.lease = None
                return
            self.lease = r.json()
        self.calls = 0

    def _release(self) -> None:
        if self.lease is None:
            return
        self.client.delete(f"/envs/{ENV}/leases/{self.lease['lease_id']}", name="release",
                           headers={"Authorization": f"Bearer {self.lease['token']}"})
        self.lease = None

    @task
    def call(self) -> None:
        if self.lease is None or self.calls >= CALLS_PER_LEASE:
            self._release()
            self._acquire()
            if self.lease is None:
                return
        tool, args = TOOLS[self.calls % len(TOOLS)]
        with self.client.post(f"/envs/{ENV}/leases/{self.lease['lease_id']}/call", name="call",
                              json={"tool": tool, "arguments": args}, catch_response=True,
                              headers={"Authorization": f"Bearer {self.lease['token']}"}) as r:
            if r.status_code != 200 or not r.json().get("ok"):
                r.failure(f"call: HTTP {r.status_code} {r.text[:200]}")
        self.calls += 1

    def on_stop(self) -> None:
        self._release()
