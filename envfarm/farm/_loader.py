"""Loading env types: a catalog record becomes a served env, in this process or in confined
workers, at start or (on-demand farms) at a type's first lease.

A type that failed to load is read again from the catalog once its files change.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from envfarm.catalog import Catalog, catalog_fingerprint, load_catalog, normalize_name
from envfarm.confined.runtime import EnvRuntime
from envfarm.errors import ConfigError, EnvfarmError, EnvLoadError, EnvNotFound
from envfarm.farm._config import FarmConfig, isolation_of
from envfarm.farm._served import LocalEnv, ServedEnv
from envfarm.worker import SpareWorkers, WorkerEnv, WorkerStartError

log = logging.getLogger("envfarm.farm")


class EnvLoader:
    """Loads the env types one farm process serves; holds what loads share: the worker options,
    spare workers, module-state verdicts and the catalog files' fingerprints."""

    #: How often a broken type's request may stat the catalog files for a change.
    catalog_stat_every_s = 2.0

    def __init__(self, config: FarmConfig, catalog: Catalog,
                 runtimes: dict[str, EnvRuntime]) -> None:
        """``runtimes``: envs compiled already in this process (trusted: they are served
        in-process, whatever ``config.isolation`` says)."""
        self.config = config
        self.catalog = catalog
        self.isolation, self._workers = isolation_of(config)
        self._runtimes = runtimes
        #: code sha256 -> the module-state probe's verdict: a type loaded again (after an
        #: eviction, or a clone under another name) skips the probe.
        self._module_state: dict[str, list[str]] = {}
        #: every type this process serves; on demand, only the hot ones load at start
        self.names = self._names_to_serve()
        self.on_demand = config.loads_on_demand(len(self.names))
        spares = config.spare_workers if config.spare_workers is not None else 2 * self.on_demand
        self._spares = (SpareWorkers(self._workers.worker_config(), spares,
                                     stderr=self._workers.stderr)
                        if self._workers is not None and spares else None)
        self.hot = [normalize_name(n) for n in config.hot]
        for name in self.hot:
            if name not in self.names:
                raise EnvNotFound(f"hot env {name!r} is not served here", env=name)
        if self.on_demand and config.max_loaded_types is not None \
                and len(self.hot) > config.max_loaded_types:
            raise ConfigError(f"{len(self.hot)} hot types exceed the cap of "
                              f"{config.max_loaded_types} loaded types (--max-loaded)")
        #: the catalog files as read, at start and per type re-read since (a broken type is
        #: re-read when they change); the files' state now is stat'ed at most every 2 s
        self._catalog_read = catalog_fingerprint(catalog.root) if self.on_demand else ()
        self._reread: dict[str, tuple] = {}
        self._catalog_now = (time.monotonic(), self._catalog_read)

    def _names_to_serve(self) -> list[str]:
        if self.config.envs is None:
            return self.catalog.servable
        names = [normalize_name(n) for n in self.config.envs]
        for name in names:
            if not self.catalog[name].servable:  # raises EnvNotFound for unknown names
                raise EnvLoadError(f"env {name!r} has no code to serve", env=name)
        return names

    def load_at_start(self, problems: list[str]) -> dict[str, ServedEnv]:
        """The types loaded before any request (the hot ones on demand, else all), in threads.
        One that fails is left out and its problem noted, unless it was asked for by name:
        then the farm fails to start."""
        envs: dict[str, ServedEnv] = {}
        with ThreadPoolExecutor(max_workers=max(1, min(4, len(self.names))),
                                thread_name_prefix="envfarm-load") as pool:
            loading = {name: pool.submit(self.load, name)
                       for name in (self.hot if self.on_demand else self.names)}
        for name, future in loading.items():
            try:
                envs[name] = future.result()
            except EnvLoadError as exc:
                if self.config.envs is not None or name in self.hot:
                    self._kill(envs)
                    raise  # asked for by name: fail loudly
                problems.append(f"{name}: {exc.message}")
                log.warning("not serving %s: %s", name, exc.message)
        return envs

    def load(self, name: str, broken: bool = False) -> ServedEnv:
        """Load one env (blocking: at start, or in a cold-start thread). ``broken``: it failed
        to load before, so its records are read again if the catalog files changed since."""
        if broken and self.catalog_changed(name):
            self._reread_bundle(name)
        bundle, pool = self.catalog[name], self.config.pool_for(name)
        if name in self._runtimes or self._workers is None:
            runtime = self._runtimes.get(name) or EnvRuntime(
                bundle, call_timeout_s=self.config.call_timeout_s)
            return LocalEnv(runtime, pool)
        code_hash = hashlib.sha256((bundle.code or "").encode()).hexdigest()
        try:
            served = WorkerEnv(bundle, self._workers, warm=pool.warm,
                               max_instances=pool.max_instances,
                               module_state=self._module_state.get(code_hash),
                               spares=self._spares)
        except WorkerStartError as exc:
            raise EnvLoadError(str(exc), env=name) from None
        self._module_state[code_hash] = served.module_state
        return served

    def catalog_changed(self, name: str) -> bool:
        """Whether the catalog files changed since ``name``'s records were read (only broken
        types ask; the files are stat'ed at most every ``catalog_stat_every_s``)."""
        when, printed = self._catalog_now
        if time.monotonic() - when >= self.catalog_stat_every_s:
            printed = catalog_fingerprint(self.catalog.root)
            self._catalog_now = (time.monotonic(), printed)
        return printed != self._reread.get(name, self._catalog_read)

    def _reread_bundle(self, name: str) -> None:
        """Take a broken type's records from the catalog as it is now (in a cold-start thread;
        the other types keep the catalog read at start)."""
        # This version counts as read even if it fails: the next try waits for the backoff
        # or another change (a catalog that stays unreadable is not re-read every request).
        self._reread[name] = catalog_fingerprint(self.catalog.root)
        try:
            fresh = load_catalog(self.catalog.root, check_code=False, only={name})
        except EnvfarmError as exc:
            raise EnvLoadError(f"the changed catalog cannot be read: {exc.message}",
                               env=name) from None
        if name not in fresh or not fresh[name].servable:
            raise EnvLoadError(f"env {name!r} has no code to serve in the changed catalog",
                               env=name)
        self.catalog.bundles[name] = fresh[name]

    def _kill(self, envs: dict[str, ServedEnv]) -> None:
        """Stop at once what a failed start loaded."""
        for served in envs.values():
            if isinstance(served, WorkerEnv):
                served.kill_all("farm failed to start")
        self.close()

    def close(self) -> None:
        if self._spares is not None:
            self._spares.close()
