"""Bad input and misbehaving env code: typed errors, unchanged state, host and neighbours fine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest


def _titles(inst):
    return [n["title"] for n in inst.call_sync("list_notes", {}).result]


@pytest.fixture
def pair(toy_runtime):
    return toy_runtime.instance(), toy_runtime.instance()


@pytest.mark.parametrize("tool,args,kind,message", [
    ("nope", {}, "agent_error", "unknown tool 'nope'; available tools: bad_response, create_note"),
    ("list_notes", [1, 2], "agent_error", "arguments must be a JSON object, got list"),
    ("list_notes", "q=1", "agent_error", "arguments must be a JSON object, got str"),
    ("get_note", {"note_id": "abc"}, "agent_error", "argument 'note_id': Input should be a valid integer"),
    ("create_note", {"title": "x", "owner_id": "one"}, "agent_error", "argument 'owner_id'"),
    ("create_note", {}, "agent_error", "missing required argument(s) title"),
    ("create_note", {"title": "x", "colour": "red"}, "agent_error", "unknown argument(s) colour"),
    ("get_note", {"note_id": 99}, "agent_error", "HTTP 404: note 99 not found"),
    ("create_then_fail", {"title": "x"}, "env_error", "raised RuntimeError: boom after a partial write"),
    ("leak_session", {}, "env_error", "raised ValueError: forgot to close the session"),
    ("bad_response", {}, "env_error", "raised ResponseValidationError"),
    ("net", {}, "env_error", "SandboxViolation"),
    ("spawn", {}, "env_error", "may not do 'subprocess.Popen'"),
    ("sleep", {}, "env_error", "may not block in time.sleep(30)"),
])
def test_bad_calls_give_typed_errors_and_leave_state_unchanged(pair, tool, args, kind, message):
    inst, other = pair
    assert inst.call_sync("create_note", {"title": "mine"}).ok
    before = inst.snapshot()
    res = inst.call_sync(tool, args)
    assert not res.ok and res.error.kind == kind
    assert message in res.error.message
    assert inst.snapshot() == before  # no partial writes, no open transaction
    assert not inst.conn.in_transaction
    assert _titles(inst) == ["groceries", "todo", "mine"]
    assert _titles(other) == ["groceries", "todo"]


def test_writing_a_file_is_refused(pair, tmp_path):
    target = tmp_path / "escaped.txt"
    res = pair[0].call_sync("write_file", {"path": str(target)})
    assert res.error.kind == "env_error" and "may not write files" in res.error.message
    assert not target.exists()


@pytest.mark.parametrize("tool", ["spin", "spin_sync", "hang"])
def test_handlers_that_never_return_time_out_and_the_host_keeps_serving(pair, tool):
    inst, other = pair
    started = time.monotonic()
    res = inst.call_sync(tool, {})
    assert time.monotonic() - started < 5
    assert res.error.kind == "env_error" and "timed out after 0.5 s" in res.error.message
    assert inst.call_sync("create_note", {"title": "after"}).ok
    assert _titles(other) == ["groceries", "todo"]


def test_sql_injection_strings_are_just_data(pair):
    inst, _ = pair
    evil = "x'; DROP TABLE notes; --"
    assert inst.call_sync("list_notes", {"q": evil}).result == []
    created = inst.call_sync("create_note", {"title": evil})
    assert created.ok and created.result["title"] == evil
    assert _titles(inst)[-1] == evil


def test_oversized_payload_is_rejected_before_env_code(pair):
    inst, _ = pair
    res = inst.call_sync("create_note", {"title": "x" * (1 << 20)})
    assert res.error.kind == "agent_error" and "the limit is 1048576 bytes" in res.error.message
    assert _titles(inst) == ["groceries", "todo"]


def test_guard_is_inert_outside_env_calls(toy_runtime, tmp_path):
    toy_runtime.instance().call_sync("net", {})  # installs the audit hook
    path = tmp_path / "host.txt"
    path.write_text("the host may still write files")
    assert path.read_text().startswith("the host")
    # What the guard refuses inside a call (the `spawn` and `net` tools) still works outside one.
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getppid())"],
                           capture_output=True, text=True, timeout=30)
    assert child.returncode == 0 and int(child.stdout) == os.getpid()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).close()


def test_a_timed_out_sync_handler_thread_is_stopped_not_left_spinning(pair):
    import threading

    inst, _ = pair
    assert inst.call_sync("spin_sync", {}).error.kind == "env_error"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        spinning = [t for t in threading.enumerate() if "spin_sync" in _functions_of(t)]
        if not spinning:
            break
        time.sleep(0.05)
    assert not spinning, "the handler's pool thread still runs env code"


def _functions_of(thread) -> set[str]:
    import sys

    frame, names = sys._current_frames().get(thread.ident), set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return names


def test_a_failed_call_restores_the_latest_state_when_the_rollback_point_is_reused(pair):
    """Reads reuse the last rollback point (no serialize per call); a write must renew it."""
    inst, _ = pair
    assert inst.call_sync("list_notes", {}).ok
    point = inst._rollback_point()
    assert inst._rollback_point() is point  # nothing written: the same bytes, no copy
    assert inst.call_sync("create_note", {"title": "first"}).ok
    assert inst._rollback_point() is not point
    assert not inst.call_sync("create_then_fail", {"title": "partial"}).ok
    assert inst.call_sync("rename_note", {"note_id": 1, "title": "renamed"}).ok
    assert not inst.call_sync("create_then_fail", {"title": "partial"}).ok
    assert _titles(inst) == ["renamed", "todo", "first"]


def test_a_reset_copy_reuses_the_template_bytes_as_its_rollback_point(pair):
    """A fresh copy takes its state key from the runtime (read once), not from the database:
    it must be the key the database gives, and a write after the reset must renew the point."""
    inst, other = pair
    assert inst.call_sync("create_note", {"title": "gone after reset"}).ok
    inst.reset()
    assert inst._saved[0] == inst._state_key() == other._state_key()
    assert inst._rollback_point() is inst.runtime.template.data  # no copy taken
    assert inst.call_sync("create_note", {"title": "after"}).ok
    assert inst._rollback_point() is not inst.runtime.template.data
    assert not inst.call_sync("create_then_fail", {"title": "partial"}).ok
    assert "after" in _titles(inst) and "partial" not in _titles(inst)


@pytest.mark.parametrize("sql", ["CREATE TABLE extra (a)", "PRAGMA user_version = 7",
                                 "PRAGMA application_id = 9", "DELETE FROM notes"])
def test_the_rollback_point_is_renewed_after_any_change_to_the_database(pair, sql):
    inst, _ = pair
    point = inst._rollback_point()
    with inst.fence.host():  # host code, outside a call
        inst.conn.execute(sql)
        inst.conn.commit()
    assert inst._rollback_point() != point
