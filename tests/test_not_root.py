"""The two commands for a user who is not root (issue 36): `make` picks a private network
namespace that user can make (an unprivileged user namespace, `unshare -rn`), the farm runs in
it, and what needs root says so instead of failing. CI runs `make demo` itself as such a user
(`.ci/run`); these are the fast checks."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _user_namespaces() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "true"], capture_output=True,
        check=False).returncode == 0


_EPISODE = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
from envfarm.client import SyncFarm
from envfarm.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig
from envfarm.jail import worker_identity
print("identity:", worker_identity().describe())
with LocalFarm(FarmConfig(envs=["hotel_booking_1"], pool=PoolConfig(warm=1))) as farm:
    with SyncFarm(farm.url) as client, client.lease("hotel_booking_1", task_idx=0) as lease:
        assert lease.call("search_hotels", {"city": "Lisbon"})["hotels"]
        verdict = lease.verify()
        assert verdict.valid and verdict.reward == 0.0, verdict
print("episode: ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not _user_namespaces(), reason="this kernel allows no user namespace here")
def test_a_farm_serves_where_only_uid_0_is_mapped():
    """`unshare -rn` maps uid 0 alone: jailed workers have no uid to switch to and keep 0
    (before: they tried `nobody`, which is not mapped there, and every worker died)."""
    run = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "sh", "-c",
         'ip link set lo up && exec "$0" "$@"', sys.executable, "-c", _EPISODE],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "identity: uid 0 like the farm (uid " in run.stdout
    assert "keep uid 0 of this user namespace" in run.stdout  # the farm's one warning line
    assert "share the farm's network namespace" not in run.stdout  # verifiers got their own
    assert "episode: ok" in run.stdout


@pytest.fixture
def shared_dir():
    """A folder every user can read (pytest's own are the runner's alone)."""
    path = Path(tempfile.mkdtemp(prefix="envfarm-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _make_demo_line(folder: Path, user: list[str], path: str | None = None) -> str:
    """The command `make -n demo` would run for ``user``, with an installed venv (one another
    user cannot write)."""
    (folder / "venv" / "bin").mkdir(parents=True, exist_ok=True)
    (folder / "venv" / "bin" / "python").touch()
    (folder / "pyproject.toml").touch()
    (folder / "venv" / ".installed").touch()
    os.utime(folder / "pyproject.toml", (0, 0))  # older than the venv: nothing to install
    for p in (folder / "venv", folder / "venv" / "bin"):
        p.chmod(0o755)
    env = {**os.environ, "PATH": path or os.environ["PATH"], "PYTEST_DEBUG_TEMPROOT": str(folder)}
    run = subprocess.run([*user, "make", "--no-print-directory", "-n", "-f", "-", "demo",
                          f"VENV={folder / 'venv'}"], input=(REPO / "Makefile").read_text(),
                         cwd=folder, capture_output=True, text=True, env=env, check=True)
    return run.stdout.strip().splitlines()[-1]


def _can_be_nobody() -> bool:
    from envfarm.jail import worker_identity  # root with other uids mapped (not `unshare -rn`)

    return worker_identity().uid_base is not None and bool(shutil.which("setpriv"))


needs_root = pytest.mark.skipif(not _can_be_nobody() or not shutil.which("make"),
                                reason="needs root with other uids (to act as one), setpriv, make")


@needs_root
def test_make_keeps_roots_namespace_and_gives_others_their_own(shared_dir):
    assert _make_demo_line(shared_dir, []).startswith("unshare --net sh -c ")
    if _user_namespaces():
        assert _make_demo_line(shared_dir, NOBODY).startswith(
            "unshare --user --map-root-user --net sh -c ")


@needs_root
def test_make_runs_without_a_namespace_where_none_is_allowed_and_says_so(shared_dir):
    fake = shared_dir / "bin"
    fake.mkdir(mode=0o755)
    (fake / "unshare").write_text("#!/bin/sh\necho 'unshare: not permitted' >&2\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    line = _make_demo_line(shared_dir, NOBODY, path=f"{fake}:{os.environ['PATH']}")
    assert line.startswith('echo "make: no private network namespace here')
    assert line.endswith("/bin/envfarm demo") and "unshare" not in line.split(">&2;")[1]


def test_verifiers_say_why_they_get_no_network_namespace(monkeypatch, caplog):
    from judge._zygote import _can_unshare_net

    monkeypatch.setenv("PATH", "/nonexistent")  # no `unshare` to make one with
    _can_unshare_net.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="judge.sandbox"):
            assert _can_unshare_net() is False
    finally:
        _can_unshare_net.cache_clear()
    assert "verifier processes share the farm's network namespace: there is no `unshare`" \
        in caplog.text


def test_serve_haproxy_gets_a_folder_of_its_own_where_the_shared_one_is_not_writable(tmp_path):
    from envfarm.serve._ingress import HAPROXY_FILES, haproxy_files

    assert haproxy_files(str(tmp_path)) == {}  # ours: Serve's own default stays
    moved = haproxy_files("/proc/envfarm-haproxy")  # nobody may write there, root included
    try:
        assert set(moved) == set(HAPROXY_FILES)
        own = Path(moved["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"])
        assert own.is_dir() and own.stat().st_uid == os.geteuid()
        assert own.stat().st_mode & 0o077 == 0  # the user's alone
        assert all(Path(path).parent == own for key, path in moved.items()
                   if key != "RAY_SERVE_HAPROXY_SERVER_STATE_BASE")
        assert len(str(own / ("0" * 56) / "metrics.sock")) < 108  # a unix socket's path limit
    finally:
        shutil.rmtree(moved.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", tmp_path / "none"),
                      ignore_errors=True)
