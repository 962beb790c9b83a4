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

from envfarm.jail import support, worker_identity
from tests.envfarm.worker.conftest import start_farm
from tests.envfarm.worker.hostile_env import with_code
from tests.envfarm.worker.raw_env import raw_code

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not support().ok, reason=f"kernel lacks: {support().describe()}"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="raw syscall numbers are x86_64's"),
]

REPO = Path(__file__).resolve().parents[3]
#: Root with uids to hand out (not uid 0 of a user namespace that maps too few: `unshare -rn`).
ROOT = worker_identity().uid_base is not None
needs_root = pytest.mark.skipif(not ROOT, reason="a farm that is not root (or root of a user "
                                "namespace with no uids to hand out) keeps its uid: there is no "
                                "privilege to drop and no uid of its own to cap threads with")
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
def farm(secret_env):
    farm = start_farm({"raw": raw_code(), "victim": with_code("")}, call_timeout_s=5.0,
                      leases_per_worker=4, check_module_state=False)
    yield farm
    farm.stop()


@pytest.fixture(scope="module")
def api(farm):
    client = Api(farm.url)
    yield client
    client.http.close()


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


def test_the_farm_says_who_its_workers_run_as(farm, caplog):
    from envfarm.farm import FarmConfig
    from envfarm.farm._config import isolation_of

    health = httpx.get(farm.url + "/healthz").json()
    with caplog.at_level("WARNING", logger="envfarm.farm"):
        isolation, _ = isolation_of(FarmConfig())
    assert health["isolation"] == isolation
    if ROOT:
        assert isolation.endswith("a uid of its own each)") and not caplog.records
    elif worker_identity().root:  # uid 0 of a small user namespace: one line says which
        assert worker_identity().describe() in isolation
        assert [r.getMessage() for r in caplog.records if "user namespace" in r.getMessage()]
    else:  # one clear line: nothing to drop, no thread cap
        assert "not root: nothing to drop" in isolation
        assert [r.getMessage() for r in caplog.records if "no privilege to drop" in
                r.getMessage()]


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


# -- what the seccomp filter refuses whoever the worker runs as -------------------------------
@pytest.mark.parametrize("folder", ["/tmp", "/dev/shm"])
def test_no_folder_can_be_watched_for_other_tenants_file_names(api, lease, folder):
    seen = api.call(lease, "watch_folder", path=folder)
    assert seen["rc"] == -1 and seen["errno"] == EPERM, seen


def test_the_event_loops_socketpair_lists_no_interfaces(api, lease):
    seen = api.call(lease, "list_interfaces")
    assert seen == {"rc": -1, "errno": EPERM, "names": []}


def test_no_mount_is_listed_or_described(api, lease):
    # struct mnt_id_req {u32 size; u32 spare; u64 mnt_id (LSMT_ROOT); u64 param}
    request = {"bytes": ((24).to_bytes(4, "little") + bytes(4) + b"\xff" * 8 + bytes(8)).hex()}
    listed = api.syscall(lease, 458, request, {"buf": 8 * 64}, 64, 0)
    assert listed["rc"] == -1 and listed["errno"] == EPERM, listed
    described = api.syscall(lease, 457, request, {"buf": 4096}, 4096, 0)
    assert described["rc"] == -1 and described["errno"] == EPERM, described


@pytest.mark.parametrize("how", ["flock", "F_SETLK", "F_OFD_SETLK"])
def test_no_lock_is_taken_on_a_host_file(api, lease, targets, how):
    """A lock held from a read-only descriptor would stall whoever on the host locks it."""
    import fcntl

    path = str(targets["plain"])
    # struct flock {short type (F_RDLCK), short whence, off_t start, off_t len, pid_t pid}
    lock = {"bytes": bytes(32).hex()}
    nr, args = {"flock": (73, [{"open": path}, fcntl.LOCK_EX | fcntl.LOCK_NB]),
                "F_SETLK": (72, [{"open": path}, fcntl.F_SETLK, lock]),
                "F_OFD_SETLK": (72, [{"open": path}, 37, lock])}[how]
    _refused(api.syscall(lease, nr, *args))
    with open(path, "rb+") as fh:  # the worker still holds its descriptor open
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_no_memory_file_is_made_or_executed(api, lease):
    seen = api.call(lease, "memfd_exec")
    assert seen["exec"] == -1 and seen["exec_errno"] == EPERM, seen
    assert seen["memfd"] == -1 and seen["memfd_errno"] == EPERM, seen


def test_syscalls_newer_than_the_filter_answer_enosys(api, lease):
    from envfarm.jail._seccomp import HIGHEST_REVIEWED

    for nr in (HIGHEST_REVIEWED + 1, HIGHEST_REVIEWED + 7, 1000):
        assert api.syscall(lease, nr, 0, 0, 0) == {"rc": -1, "errno": 38, "bufs": []}


def test_no_descriptor_the_worker_holds_lets_it_write(api, lease):
    assert api.call(lease, "write_through_fds", name="jail34-planted")["made"] == {}
    assert not list(REPO.rglob("jail34-planted"))


# -- doors that were already shut: kept shut (each answered by the kernel, not the guard) ------
def _front_pid() -> int:
    return os.getpid()


DOORS = {
    "ptrace attach the front": (101, lambda: [16, _front_pid(), 0, 0]),
    "process_vm_readv the front": (310, lambda: [_front_pid(), 0, 0, 0, 0, 0]),
    "kcmp": (312, lambda: [_front_pid(), _front_pid(), 0, 0, 0]),
    "pidfd_open the front": (434, lambda: [_front_pid(), 0]),
    "userfaultfd": (323, lambda: [0]),
    "io_uring_setup": (425, lambda: [8, {"buf": 120}]),
    "perf_event_open": (298, lambda: [{"buf": 128}, 0, -1, -1, 0]),
    "bpf": (321, lambda: [0, {"buf": 128}, 128]),
    "keyctl": (250, lambda: [0, -4, 0]),
    "unshare a user namespace": (272, lambda: [0x10000000]),
    "mount": (165, lambda: ["none", "/tmp", "tmpfs", 0, 0]),
    "open_by_handle_at": (304, lambda: [AT_FDCWD, {"buf": 128}, 0]),
    "execve /bin/sh": (59, lambda: ["/bin/sh", 0, 0]),
    "fork": (57, lambda: []),
    "socket": (41, lambda: [2, 1, 0]),
    "personality": (135, lambda: [0x0400000]),
    "kill the front": (62, lambda: [_front_pid(), 0]),
    "lower the front's rlimit": (302, lambda: [_front_pid(), 7, {"buf": 16}, 0]),
    "cancel death with the parent, upper bits set": (157, lambda: [(1 << 32) | 1, 0]),
    "the front's environ": (257, lambda: [AT_FDCWD, f"/proc/{_front_pid()}/environ", 0]),
    "the front's memory": (257, lambda: [AT_FDCWD, f"/proc/{_front_pid()}/mem", 0]),
    "the front's descriptors": (257, lambda: [AT_FDCWD, f"/proc/{_front_pid()}/fd", 0o200000]),
    "own environ file": (257, lambda: [AT_FDCWD, "/proc/self/environ", 0]),
    "project files": (257, lambda: [AT_FDCWD, str(REPO / "pyproject.toml"), 0]),
}


@pytest.mark.parametrize("door", list(DOORS))
def test_kernel_doors_stay_shut(api, lease, door):
    nr, args = DOORS[door]
    seen = api.syscall(lease, nr, *args())
    assert seen["rc"] == -1 and seen["errno"] in (EPERM, EACCES), seen


def _workers() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children()
            if "envfarm.worker" in " ".join(p.cmdline())]


def test_other_workers_processes_are_out_of_reach(api, lease):
    api.call(api.lease("victim"), "list_notes")  # a worker of another env type exists
    own = api.call(lease, "identity")["pid"]
    others = [pid for pid in _workers() if pid != own]
    assert others
    for pid in others:
        for leaf in ("environ", "mem", "fd", "maps", "cmdline"):
            seen = api.syscall(lease, 257, AT_FDCWD, f"/proc/{pid}/{leaf}", 0)
            assert seen["rc"] == -1 and seen["errno"] in (EPERM, EACCES), (pid, leaf, seen)
