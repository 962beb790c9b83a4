"""The verifier sandbox against the attacks of issue 34: file metadata, watching, memory files.

Verifier code reaches ``os`` through an allowed object (as in test_verifier_isolation.py); the
audit hook refuses what raises an audit event (``os.chmod``, ``os.utime``, ...), and the kernel
refuses the rest. The staged database copies belong to root: a verifier of a root farm runs as
an unprivileged uid of its own, so neither layer is needed for them to stay as they are.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from envfarm.jail import support
from tests.judge.test_verifier_isolation import _code

pytestmark = pytest.mark.skipif(not support().ok, reason=f"kernel lacks: {support().describe()}")


def _status_ids(pid: int) -> tuple[list[int], list[int], str]:
    lines = dict(line.split(":", 1) for line in
                 Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return ([int(x) for x in lines["Uid"].split()], [int(x) for x in lines["Gid"].split()],
            lines["Groups"].strip())


@pytest.mark.skipif(os.geteuid() != 0, reason="a verifier of a farm that is not root keeps its uid")
def test_the_verifier_zygote_runs_as_an_unprivileged_uid_of_its_own(sandbox):
    (pid,) = sandbox.pids
    uids, gids, groups = _status_ids(pid)
    assert uids[0] != 0 and uids == [uids[0]] * 4 and gids == [uids[0]] * 4, (uids, gids)
    assert groups == ""


ATTACKS = {
    "chmod": "g['chmod'](a, 0o4777)",
    "utime": "g['utime'](a, (0, 0))",
    "setxattr": "g['setxattr'](a, 'user.x', b'1')",
    "lockf": "fd = g['open'](a, 0); g['lockf'](fd, 1, 0)",
    "memfd_create": "g['memfd_create']('x')",
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_verifiers_change_no_file_metadata_and_make_no_memory_file(sandbox, small_dbs, attack):
    res = sandbox.run_sync(_code(f"""
try:
    {ATTACKS[attack]}
    return {{'result': 'others', 'done': True}}
except OSError as exc:
    return {{'result': 'others', 'done': False, 'errno': exc.errno}}
"""), *small_dbs)
    assert not (res.ok and res.result.get("done")), res
    staged = list(Path(sandbox._stager.dir).iterdir())  # the copies the verifier was given
    assert staged
    for path in staged:
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o444 and st.st_mtime > 1e9, path
        assert os.listxattr(path) == []
