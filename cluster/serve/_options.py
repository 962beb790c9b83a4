"""Serve-side options: replicas/autoscaling per env, packing, where the proxy listens."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DeploymentOptions(BaseModel):
    """Replicas of one env's (or one pack's) deployment."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(default=1, ge=1, le=1000,
                              description="Fixed replica count (ignored with autoscaling).")
    autoscaling_config: dict[str, Any] | None = Field(
        default=None, description="Serve autoscaling_config (min_replicas, max_replicas, ...).")
    max_ongoing_requests: int = Field(default=512, ge=1,
                                      description="Concurrent requests per replica.")
    num_cpus: float = Field(default=0.0, ge=0,
                            description="CPUs reserved per replica (0: share the machine).")
    door_replicas: int = Field(
        default=1, ge=1, le=1000,
        description="Replicas of the stateless Door in front of a multi-replica pool under "
                    "HAProxy (each is one process, ~1 core of forwarding; more spread the "
                    "load and survive a node loss).")
    door_hop: Literal["http", "handle"] | None = Field(
        default=None,
        description="How the Door sends a lease's requests to the replica that owns it: over "
                    "HTTP to that replica's own listener (kept-alive connections), or as a Serve "
                    "handle call routed to the owner (a Ray actor call: several times the CPU). "
                    "Default: http for a fixed replica count, handle under autoscaling (Serve's "
                    "autoscaler counts the requests its handles route; the HTTP hop bypasses "
                    "them, so the pool would never scale).")
    access_log: bool = Field(
        default=False,
        description="Serve's access log: a line per request in the replica's log file, i.e. "
                    "per tool call (~140 bytes and ~25 µs of replica CPU each; the status page "
                    "and /metrics count calls without it). Off also sets Serve's replica "
                    "logger to WARNING.")

    @model_validator(mode="after")
    def _autoscaling_sees_its_requests(self) -> DeploymentOptions:
        if self.autoscaling_config is not None and self.door_hop == "http":
            raise ValueError("door_hop='http' bypasses Serve's request counts, which autoscaling "
                             "scales on: use 'handle' (the default under autoscaling)")
        return self

    @property
    def hop(self) -> Literal["http", "handle"]:
        """The Door's hop to a lease's owner (see ``door_hop``)."""
        if self.door_hop is not None:
            return self.door_hop
        return "handle" if self.autoscaling_config is not None else "http"

    def serve_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_ongoing_requests": self.max_ongoing_requests,
                               "ray_actor_options": {"num_cpus": self.num_cpus},
                               "logging_config": access_logging(self.access_log)}
        if self.autoscaling_config is not None:
            out["autoscaling_config"] = self.autoscaling_config
        else:
            out["num_replicas"] = self.num_replicas
        return out


def access_logging(on: bool) -> dict[str, Any]:
    """A deployment's Serve ``logging_config`` with its access log on or off.

    Off means Serve's logger at WARNING, not just ``enable_access_log=False``: that flag is a
    handler filter, so Serve still builds and formats every access record first. Measured on a
    trivial app (RESULTS.md, "Serve's own cost per request"): INFO with the access log 153 µs
    of replica CPU per request, the filter 138 µs, WARNING 128 µs. Serve's INFO lines about
    the replica (start, stop) go with it; warnings and errors stay."""
    return {"enable_access_log": on, "log_level": "INFO" if on else "WARNING"}


class ServeOptions(BaseModel):
    """How the farm is laid out on Ray Serve."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="Where Serve's HTTP ingress listens.")
    proxy: Literal["haproxy", "python"] = Field(
        default="haproxy",
        description="Serve's HTTP ingress: HAProxy straight to replicas (fast; its replica "
                    "ports bind all interfaces), or the Python proxy (one extra hop).")
    port: int = Field(default=8000, ge=0, le=65535)
    pack: int = Field(default=1, ge=1, le=1000,
                      description="Env types per deployment; >1 packs several envs into one "
                                  "deployment (reached through the front app).")
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    per_env: dict[str, DeploymentOptions] = Field(default_factory=dict,
                                                  description="Overrides by env (pack=1 only).")
    front_replicas: int = Field(default=1, ge=1, description="Replicas of the front app.")
    num_cpus: int | None = Field(default=None, ge=1, description="ray.init num_cpus.")

    @model_validator(mode="after")
    def _per_env_needs_no_pack(self) -> ServeOptions:
        if self.per_env and self.pack > 1:
            raise ValueError("per-env deployment options need pack=1")
        return self

    def for_env(self, env: str) -> DeploymentOptions:
        return self.per_env.get(env, self.deployment)
