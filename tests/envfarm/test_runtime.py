from __future__ import annotations

import asyncio
import sqlite3

import pytest

from envfarm import EnvRuntime


def test_real_awm_env_lists_tools_with_merged_schemas(content_platform):
    names = {t.name for t in content_platform.tools}
    assert len(names) == 34
    upload = next(t for t in content_platform.tools if t.name == "upload_video")
    props = upload.input_schema["properties"]
    assert {"video_id", "channel_id", "title", "visibility"} <= set(props)  # body fields, flat
    assert "title" in upload.input_schema["required"]
    search = next(t for t in content_platform.tools if t.name == "search_channels")
    assert set(search.input_schema["properties"]) == {"query", "limit", "offset"}  # query params
    assert search.description.startswith("Search")
    get = next(t for t in content_platform.tools if t.name == "get_channel_by_id")
    assert get.input_schema["required"] == ["channel_id"]  # a path param


def test_call_read_write_reset_and_isolation(content_platform):
    a, b = content_platform.instance(), content_platform.instance()
    before = a.call_sync("list_user_subscriptions", {}).result["subscriptions"]
    sub = a.call_sync("subscribe_to_channel", {"channel_id": 3})
    assert sub.ok and sub.status == 200 and sub.result["subscription"]["channel_id"] == 3
    after_a = a.call_sync("list_user_subscriptions", {}).result["subscriptions"]
    after_b = b.call_sync("list_user_subscriptions", {}).result["subscriptions"]
    assert len(after_a) == len(before) + 1
    assert after_b == before  # no leak between instances of one loaded module
    a.reset()
    assert a.call_sync("list_user_subscriptions", {}).result["subscriptions"] == before


def test_snapshots_are_sqlite_files_for_verifiers(content_platform, tmp_path):
    inst = content_platform.instance()
    inst.call_sync("subscribe_to_channel", {"channel_id": 3})
    initial, final = inst.write_snapshots(tmp_path)
    q = "SELECT COUNT(*) FROM user_subscriptions WHERE channel_id = 3"
    assert sqlite3.connect(initial).execute(q).fetchone()[0] == 0
    assert sqlite3.connect(final).execute(q).fetchone()[0] == 1
    assert inst.initial_snapshot() == content_platform.template.data


def test_env_without_ddl_gets_tables_from_its_orm(awm_catalog):
    rt = EnvRuntime(awm_catalog["communication_messaging_1"])
    assert rt.template.tables == 22 and rt.template.rows > 100
    res = rt.instance().call_sync("list_labels", {})
    assert res.ok, res.error


def test_env_with_schema_but_no_data_serves_an_empty_db(awm_catalog):
    rt = EnvRuntime(awm_catalog["code_hosting_2"])
    assert rt.template.tables == 22 and rt.template.rows == 0
    assert len(rt.tools) == 61


async def test_many_instances_concurrently_stay_isolated(toy_runtime):
    instances = [toy_runtime.instance() for _ in range(50)]
    await asyncio.gather(*(inst.call("create_note", {"title": f"note {i}"})
                           for i, inst in enumerate(instances)))
    for i, inst in enumerate(instances):
        titles = [n["title"] for n in (await inst.call("list_notes", {})).result]
        assert titles == ["groceries", "todo", f"note {i}"]


async def test_concurrent_calls_on_one_instance_are_serialized(toy_runtime):
    inst = toy_runtime.instance()
    results = await asyncio.gather(*(inst.call("create_note", {"title": f"n{i}"})
                                     for i in range(20)))
    assert all(r.ok for r in results)
    assert len({r.result["id"] for r in results}) == 20
    assert len((await inst.call("list_notes", {})).result) == 22


def test_sync_handlers_bind_to_the_calling_instance(toy_runtime):
    a, b = toy_runtime.instance(), toy_runtime.instance()
    assert a.call_sync("create_note_sync", {"title": "from a"}).ok
    assert [n["title"] for n in b.call_sync("list_notes", {}).result] == ["groceries", "todo"]
    assert a.call_sync("list_notes", {"q": "from"}).result == [{"id": 3, "title": "from a"}]


def test_bad_code_is_a_load_error_with_the_cause():
    from envfarm.errors import EnvLoadError

    from tests.fakes.toy_env import toy_bundle

    with pytest.raises(EnvLoadError, match="ModuleNotFoundError"):
        EnvRuntime(toy_bundle("import definitely_not_a_module\n"))
    with pytest.raises(EnvLoadError, match="SyntaxError"):
        EnvRuntime(toy_bundle("def broken(:\n"))
    with pytest.raises(EnvLoadError, match="FastAPI apps"):
        EnvRuntime(toy_bundle("x = 1\n"))


def test_the_runtime_imports_without_ray(tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['ray'] = None\n"
            "import envfarm, envfarm.runtime, envfarm.check, envfarm.cli_envs, envfarm.catalog\n"
            "assert not any(m == 'ray' or m.startswith('ray.') for m in sys.modules if sys.modules[m])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_optional_body_models_are_flattened_too(toy_runtime):
    tool = next(t for t in toy_runtime.tools if t.name == "rename_note")
    assert set(tool.input_schema["properties"]) == {"note_id", "title"}
    inst = toy_runtime.instance()
    assert inst.call_sync("rename_note", {"note_id": 1, "title": "shopping"}).result["title"] == "shopping"
    assert inst.call_sync("rename_note", {"note_id": 2}).result["title"] == "todo"


@pytest.mark.parametrize("catalog_fixture", ["bundled_catalog", "awm_catalog"])
def test_one_openapi_generation_gives_the_tools_app_openapi_gives(request, catalog_fixture):
    """A cold start makes the app's OpenAPI once, the fastapi-mcp way, and reads the tools
    from it: the tools must be exactly those read from ``app.openapi()``."""
    from envfarm._tools import extract_operations, openapi_as_fastapi_mcp

    catalog = request.getfixturevalue(catalog_fixture)
    for env in catalog.servable:
        runtime = EnvRuntime(catalog[env])
        ops, problems = extract_operations(runtime.app)  # app.openapi(), as before
        assert runtime.tools == [op.spec for op in ops.values()], env
        assert runtime.mcp_openapi() == openapi_as_fastapi_mcp(runtime.app), env
        assert [p for p in runtime.problems if "operation_id" in p] == problems, env


def test_an_app_that_changes_its_own_openapi_gets_it_generated_twice():
    from fastapi import FastAPI

    from envfarm._tools import openapi_for_tools

    plain = FastAPI()

    @plain.get("/items", operation_id="list_items")
    def list_items() -> list[str]:
        return []

    assert openapi_for_tools(plain)["paths"]["/items"]["get"]["operationId"] == "list_items"
    custom = FastAPI()
    custom.openapi = lambda: {"paths": {}}
    merged = FastAPI(separate_input_output_schemas=False)
    assert openapi_for_tools(custom) is None and openapi_for_tools(merged) is None
