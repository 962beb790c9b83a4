"""`envfarm demo --no-ray`, `envfarm lease ...` and `envfarm serve --write-config` end to end."""

from __future__ import annotations

import json

import pytest
import typer
import yaml
from typer.testing import CliRunner

from envfarm import cli_farm
from envfarm.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig, free_port
from tests.envfarm.farm.conftest import ENV

runner = CliRunner()


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    cli_farm.register(app)
    return app


def test_demo_without_ray_runs_an_episode(cli):
    result = runner.invoke(cli, ["demo", "--no-ray", "--port", str(free_port())])
    assert result.exit_code == 0, result.output
    assert "outcome=completed reward=1.0 valid=True" in result.output
    assert "release: closed" in result.output


def test_lease_commands_against_a_running_farm(cli):
    with LocalFarm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1))) as farm:
        env = {"ENVFARM_URL": farm.url}
        made = runner.invoke(cli, ["lease", "create", ENV, "--task", "0"], env=env)
        assert made.exit_code == 0, made.output
        info = json.loads(made.output)
        env |= {"ENVFARM_ENV": ENV, "ENVFARM_LEASE": info["lease_id"],
                "ENVFARM_TOKEN": info["token"]}
        tools = json.loads(runner.invoke(cli, ["lease", "tools"], env=env).output)
        assert "create_wishlist" in {t["name"] for t in tools}
        called = runner.invoke(cli, ["lease", "call", "create_wishlist", '{"name": "cli"}'],
                               env=env)
        assert json.loads(called.output)["ok"] is True
        verdict = json.loads(runner.invoke(cli, ["lease", "verify"], env=env).output)
        assert verdict["valid"] is True and verdict["reward"] == 0.0
        released = json.loads(runner.invoke(cli, ["lease", "release"], env=env).output)
        assert released["status"] == "closed"
        gone = runner.invoke(cli, ["lease", "tools"], env=env)
        assert gone.exit_code == 1 and "LeaseLost" in gone.output
        bad = runner.invoke(cli, ["lease", "call", "x", "{nope"], env=env)
        assert bad.exit_code != 0


def test_serve_writes_a_serve_config(cli, tmp_path):
    out = tmp_path / "farm.yaml"
    result = runner.invoke(cli, ["serve", "--write-config", str(out), "--replicas", "3"])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(out.read_text())
    assert config["applications"][-1]["route_prefix"] == "/"
    assert config["applications"][0]["args"]["deployment"]["num_replicas"] == 3
    assert "access_log" not in config["applications"][0]["args"]["deployment"]  # off
    result = runner.invoke(cli, ["serve", "--write-config", str(out), "--access-log"])
    assert result.exit_code == 0, result.output
    *pools, front = yaml.safe_load(out.read_text())["applications"]
    assert front["args"]["access_log"] is True
    assert all(p["args"]["deployment"]["access_log"] is True for p in pools)
    result = runner.invoke(cli, ["serve", "--write-config", str(out), "--quarantine-share", "0.3",
                                 "--quarantine-window", "120"])
    assert result.exit_code == 0, result.output
    *pools, _ = yaml.safe_load(out.read_text())["applications"]
    assert all(p["args"]["farm"]["quarantine"] == {"window_s": 120.0, "max_env_error_share": 0.3,
                                                   "max_invalid_share": 0.3} for p in pools)


@pytest.mark.parametrize("flags", [["--pack", "2"], ["--replicas", "3"], ["--num-cpus", "2"],
                                   ["--address", "auto"], ["--replicas", "1"],
                                   ["--write-config", "farm.yaml"], ["--access-log"],
                                   ["--pack", "2", "--num-cpus", "4"]])
def test_serve_no_ray_rejects_ray_only_flags(cli, flags, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # A missing catalog: were the flags let through, serve would fail fast instead of serving.
    result = runner.invoke(cli, ["serve", "--no-ray", "--catalog", str(tmp_path / "none"),
                                 "--port", str(free_port()), *flags])
    assert result.exit_code == 2, result.output
    named = [f for f in flags if f.startswith("--")]
    assert f"{', '.join(named)} only apply to a Ray Serve farm" in result.output
    assert "listening" not in result.output and not (tmp_path / "farm.yaml").exists()
