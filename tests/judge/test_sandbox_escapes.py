"""Verifier code tries to reach other files through SQLite (issue 12 §1): ATTACH and VACUUM INTO
from ``:memory:`` connections, connection objects made around the shim, and lifting the limits."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from judge import VerifierErrorKind


@pytest.fixture
def secret_db() -> Iterator[Path]:
    """A database any user may read (as another tenant's file might be), outside the sandbox."""
    folder = Path(tempfile.mkdtemp(prefix="envfarm-secret-"))
    os.chmod(folder, 0o755)
    path = folder / "secret.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE keys (v TEXT)")
    conn.execute("INSERT INTO keys VALUES ('sk-secret-123')")
    conn.commit()
    conn.close()
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def drop_folder() -> Iterator[Path]:
    """A folder any user may write to, where a verifier would like to leave a file."""
    folder = Path(tempfile.mkdtemp(prefix="envfarm-drop-"))
    os.chmod(folder, 0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _verifier(body: str) -> str:
    lines = "\n".join("    " + line for line in body.strip().splitlines())
    return f"def verify_task(initial_db_path, final_db_path):\n    import sqlite3\n{lines}\n"


READ_SECRET = {
    "memory_attach": """
c = sqlite3.connect(':memory:')
c.execute("ATTACH DATABASE '{secret}' AS s")
return {{'got': c.execute('SELECT v FROM s.keys').fetchall()}}
""",
    "final_db_attach": """
c = sqlite3.connect(final_db_path)
c.execute("ATTACH DATABASE '{secret}' AS s")
return {{'got': c.execute('SELECT v FROM s.keys').fetchall()}}
""",
    "raised_limit": """
c = sqlite3.connect(':memory:')
c.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 10)
c.execute("ATTACH DATABASE '{secret}' AS s")
return {{'got': c.execute('SELECT v FROM s.keys').fetchall()}}
""",
    "no_authorizer": """
c = sqlite3.connect(':memory:')
c.set_authorizer(None)
c.execute("ATTACH DATABASE '{secret}' AS s")
return {{'got': c.execute('SELECT v FROM s.keys').fetchall()}}
""",
    "direct_class": """
c = sqlite3.Connection(':memory:')
c.execute("ATTACH DATABASE '{secret}' AS s")
return {{'got': c.execute('SELECT v FROM s.keys').fetchall()}}
""",
    "other_factory": """
class C(sqlite3.Connection):
    pass
c = sqlite3.connect(':memory:', factory=C)
c.execute("ATTACH DATABASE '{secret}' AS s")
return {{'got': c.execute('SELECT v FROM s.keys').fetchall()}}
""",
    "swallowed": """
c = sqlite3.connect(':memory:')
try:
    c.execute("ATTACH DATABASE '{secret}' AS s")
    return {{'got': c.execute('SELECT v FROM s.keys').fetchall()}}
except Exception as exc:
    return {{'got': str(exc)}}
""",
}


@pytest.mark.parametrize("attack", sorted(READ_SECRET))
def test_verifiers_cannot_read_other_database_files(sandbox, small_dbs, secret_db, attack):
    res = sandbox.run_sync(_verifier(READ_SECRET[attack].format(secret=secret_db)), *small_dbs)
    assert "sk-secret" not in str(res.result) and "sk-secret" not in (res.error or "")
    if attack == "swallowed":
        assert res.ok and "not authorized" in res.result["got"]
    else:
        assert not res.ok
        assert res.error_kind in (VerifierErrorKind.raised, VerifierErrorKind.forbidden), res


WRITE_FILE = {
    "memory_attach": """
c = sqlite3.connect(':memory:')
c.execute("ATTACH DATABASE '{target}' AS x")
c.execute('CREATE TABLE x.loot (v)')
return {{}}
""",
    "memory_vacuum_into": """
c = sqlite3.connect(':memory:')
c.execute('CREATE TABLE t (v)')
c.execute("VACUUM INTO '{target}'")
return {{}}
""",
    "final_db_vacuum_into": """
sqlite3.connect(final_db_path).execute("VACUUM INTO '{target}'")
return {{}}
""",
    "deserialize": """
c = sqlite3.connect(':memory:')
c.deserialize(b'SQLite format 3\\x00' + bytes(100))
return {{}}
""",
}


@pytest.mark.parametrize("attack", sorted(WRITE_FILE))
def test_verifiers_cannot_create_files_through_sqlite(sandbox, small_dbs, drop_folder, attack):
    target = drop_folder / "copy.db"
    res = sandbox.run_sync(_verifier(WRITE_FILE[attack].format(target=target)), *small_dbs)
    assert not res.ok, res
    assert not target.exists()
    assert os.listdir(drop_folder) == []


def test_reading_the_schema_still_works(sandbox, small_dbs):
    code = _verifier("""
c = sqlite3.connect(final_db_path)
cols = [r[1] for r in c.execute("PRAGMA table_info(t)")]
m = sqlite3.connect(':memory:')
m.execute('CREATE TABLE k (v)')
m.execute('INSERT INTO k VALUES (1)')
return {'cols': cols, 'memory': m.execute('SELECT v FROM k').fetchall()}
""")
    res = sandbox.run_sync(code, *small_dbs)
    assert res.ok, res.error
    assert res.result == {"cols": ["x"], "memory": [[1]]}
