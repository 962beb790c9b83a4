"""The env workers' kernel jail, attacked with raw system calls through the farm's HTTP API
(issue 34).

Env code switches the in-process guard off (one line) and calls the kernel through ``ctypes``.
The host files it aims at sit in a folder inside the project, which workers may read, and belong
to whoever runs the tests: as root, a worker could change them (it ran as uid 0: their owner)
until workers got an unprivileged uid of their own; the seccomp filter refuses the same calls
whoever owns the file, so these tests hold for a non-root farm too. Each test checks the file
from the host's side afterwards.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import tempfile
from pathlib import Path

import httpx
import pytest

from envfarm.jail import support
from tests.envfarm.worker.conftest import start_farm
from tests.envfarm.worker.hostile_env import with_code
from tests.envfarm.worker.raw_env import raw_code

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not support().ok, reason=f"kernel lacks: {support().describe()}"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="raw syscall numbers are x86_64's"),
]

REPO = Path(__file__).resolve().parents[3]
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="a farm that is not root keeps its uid: there is "
                                "no privilege to drop and no uid of its own to cap threads with")
AT_FDCWD = -100
EPERM, EACCES = 1, 13
MAX_THREADS = 128  # envfarm.worker._main.MAX_THREADS


class Api:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=60)

    def lease(self, env: str = "raw") -> tuple[str, dict[str, str]]:
        r = self.http.post(f"/envs/{env}/leases", json={})
        assert r.status_code == 201, r.text
        info = r.json()
        return f"/envs/{env}/leases/{info['lease_id']}", {"Authorization": f"Bearer {info['token']}"}

    def call(self, lease: tuple[str, dict], tool: str, /, **arguments) -> dict:
        r = self.http.post(lease[0] + "/call", headers=lease[1],
                           json={"tool": tool, "arguments": arguments})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["ok"], body
        return body["result"]

    def syscall(self, lease, nr: int, *args) -> dict:
        return self.call(lease, "raw_syscall", nr=nr, args=json.dumps(list(args)))


@pytest.fixture(scope="module")
def api(secret_env):
    farm = start_farm({"raw": raw_code(), "victim": with_code("")}, call_timeout_s=5.0,
                      leases_per_worker=4, check_module_state=False)
    client = Api(farm.url)
    yield client
    client.http.close()
    farm.stop()


@pytest.fixture(scope="module")
def lease(api):
    return api.lease()


@pytest.fixture
def targets():
    """A root-only secret, a program and a plain file with an xattr and an old mtime, in a
    folder inside the project (workers may read there; anyone may search it)."""
    folder = Path(tempfile.mkdtemp(dir=REPO, prefix=".jail-targets-"))
    os.chmod(folder, 0o755)
    secret, program, plain = folder / "secret", folder / "program", folder / "plain"
    secret.write_text("root-only-secret")
    os.chmod(secret, 0o600)
    shutil.copyfile(__file__, program)
    os.chmod(program, 0o755)
    plain.write_text("plain")
    os.chmod(plain, 0o644)
    os.setxattr(plain, "user.keep", b"1")
    os.utime(plain, (1_000_000_000, 1_000_000_000))
    yield {"secret": secret, "program": program, "plain": plain}
    shutil.rmtree(folder, ignore_errors=True)


def _refused(seen: dict) -> None:
    assert seen["rc"] == -1 and seen["errno"] in (EPERM, EACCES), seen


def _modes(targets: dict) -> dict:
    return {name: os.stat(path).st_mode for name, path in targets.items()}


def _owners(targets: dict) -> dict:
    return {name: (os.stat(path).st_uid, os.stat(path).st_gid) for name, path in targets.items()}


@needs_root
def test_workers_run_as_unprivileged_uids_of_their_own(api, lease):
    leases = [api.lease() for _ in range(4)]  # 4 per worker: the last is on a second worker
    first, second = (api.call(x, "identity") for x in (lease, leases[-1]))
    for seen in (first, second):
        uid = seen["uid"][0]
        assert uid != 0 and seen["uid"] == [uid] * 3 and seen["gid"] == [uid] * 3, seen
        assert seen["groups"] == []
        status = Path(f"/proc/{seen['pid']}/status").read_text()
        assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in status
    assert first["uid"] != second["uid"]


@pytest.mark.parametrize("name", ["colorsys", "lzma", "xml.dom.minidom", "email.mime.text",
                                  "sqlalchemy.dialects.postgresql", "jsonschema"])
def test_env_code_still_imports_lazily_after_the_drop(api, lease, name):
    """Stdlib and site-packages modules, C extensions and submodules of packages imported
    before the drop, imported by env code (guard on) from a worker that no longer is root."""
    assert api.call(lease, "lazy_import", name=name)["file"].endswith((".py", ".so"))


@pytest.mark.parametrize("how", ["chmod", "fchmod", "fchmodat", "fchmodat2"])
def test_no_mode_changes_setuid_plant_or_secret_opened(api, lease, targets, how):
    before = _modes(targets)
    for name, mode in (("program", 0o4755), ("secret", 0o644), ("plain", 0o666)):
        path = str(targets[name])
        nr, args = {"chmod": (90, [path, mode]), "fchmod": (91, [{"open": path}, mode]),
                    "fchmodat": (268, [AT_FDCWD, path, mode]),
                    "fchmodat2": (452, [AT_FDCWD, path, mode, 0])}[how]
        seen = api.syscall(lease, nr, *args)
        assert seen["rc"] == -1, (name, seen)
    after = _modes(targets)
    assert after == before
    assert not after["program"] & stat.S_ISUID


@needs_root
def test_a_root_only_file_in_a_readable_folder_stays_unreadable(api, lease, targets):
    seen = api.syscall(lease, 257, AT_FDCWD, str(targets["secret"]), os.O_RDONLY)
    assert seen == {"rc": -1, "errno": EACCES, "bufs": []}


@pytest.mark.parametrize("how", ["chown", "lchown", "fchown", "fchownat"])
def test_no_owner_changes(api, lease, targets, how):
    before = _owners(targets)
    path = str(targets["plain"])
    nr, args = {"chown": (92, [path, 65534, 65534]), "lchown": (94, [path, 65534, 65534]),
                "fchown": (93, [{"open": path}, 65534, 65534]),
                "fchownat": (260, [AT_FDCWD, path, 65534, 65534, 0])}[how]
    _refused(api.syscall(lease, nr, *args))
    assert _owners(targets) == before


@pytest.mark.parametrize("how", ["setxattr", "lsetxattr", "fsetxattr", "removexattr",
                                 "lremovexattr", "fremovexattr"])
def test_no_extended_attributes_change(api, lease, targets, how):
    path = str(targets["plain"])
    nr, args = {"setxattr": (188, [path, "user.planted", "x", 1, 0]),
                "lsetxattr": (189, [path, "user.planted", "x", 1, 0]),
                "fsetxattr": (190, [{"open": path}, "user.planted", "x", 1, 0]),
                "removexattr": (197, [path, "user.keep"]),
                "lremovexattr": (198, [path, "user.keep"]),
                "fremovexattr": (199, [{"open": path}, "user.keep"])}[how]
    _refused(api.syscall(lease, nr, *args))
    assert os.listxattr(targets["plain"]) == ["user.keep"]


@pytest.mark.parametrize("how", ["utime", "utimes", "futimesat", "utimensat"])
def test_no_timestamps_change(api, lease, targets, how):
    path = str(targets["plain"])
    nr, args = {"utime": (132, [path, 0]), "utimes": (235, [path, 0]),
                "futimesat": (261, [AT_FDCWD, path, 0]),
                "utimensat": (280, [AT_FDCWD, path, 0, 0])}[how]
    _refused(api.syscall(lease, nr, *args))
    assert os.stat(targets["plain"]).st_mtime == 1_000_000_000


def _flags(path: Path) -> int:
    import array
    import fcntl

    buf = array.array("i", [0])
    with open(path, "rb") as fh:
        fcntl.ioctl(fh.fileno(), 0x80086601, buf)  # FS_IOC_GETFLAGS
    return buf[0]


@pytest.mark.parametrize("request_name", ["FS_IOC_SETFLAGS", "FS_IOC_FSSETXATTR"])
def test_no_file_flags_change_through_a_read_only_descriptor(api, lease, targets, request_name):
    before = _flags(targets["plain"])
    noatime = {"FS_IOC_SETFLAGS": (0x40086602, (0x80).to_bytes(8, "little")),  # FS_NOATIME_FL
               # struct fsxattr {xflags, extsize, nextents, projid, cowextsize, pad[8]}
               "FS_IOC_FSSETXATTR": (0x401C5820, (0x40).to_bytes(4, "little") + bytes(24))}
    request, arg = noatime[request_name]
    seen = api.syscall(lease, 16, {"open": str(targets["plain"])}, request, {"bytes": arg.hex()})
    _refused(seen)
    assert _flags(targets["plain"]) == before


@needs_root
def test_a_thread_bomb_stops_at_the_workers_cap_which_it_cannot_lift(api):
    bomber, victim = api.lease(), api.lease("victim")
    assert api.call(victim, "create_note", title="victim-state")
    seen = api.call(bomber, "thread_bomb", count=1000, lift=True)
    assert seen["setrlimit"] == "ValueError" and seen["setuid0"] == "PermissionError", seen
    assert seen["limit"] == [MAX_THREADS, MAX_THREADS]
    assert seen["started"] < MAX_THREADS and "can't start new thread" in seen["stopped_by"], seen
    assert api.call(bomber, "identity")  # the worker lives on, and so do its neighbours
    assert "victim-state" in [n["title"] for n in api.call(victim, "list_notes")]
