"""The live status page in a real headless Chromium, against a real --no-ray farm on loopback.

``ENVFARM_STATUS_SCREENSHOT=docs/status.png pytest tests/envfarm/farm/test_status_page.py``
also saves what the browser saw (the screenshot in docs/operations.md).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from envfarm.client import SyncFarm
from envfarm.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
BUNDLED = ["hotel_booking_1", "personal_banking_1", "project_management_1"]


@pytest.fixture
def browser(monkeypatch) -> Iterator[object]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Chromium and its driver on PATH: apt-get install chromium "
                    "chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,760"):
        options.add_argument(arg)
    monkeypatch.setenv("SE_OFFLINE", "true")  # never let Selenium Manager download anything
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 20.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"the page never showed {what}")


def cells(driver, env: str) -> dict[str, str]:
    """The text of each cell of an env's row, by field (empty when the row is not there)."""
    return driver.execute_script(
        "const row = document.querySelector(`tr[data-env='${arguments[0]}']`);"
        "if (!row) return {};"
        "return Object.fromEntries([...row.cells].map(c => [c.dataset.field, c.textContent]));",
        env)


def test_status_page_shows_the_farm_and_follows_a_burst_of_calls(browser, bundled_catalog):
    with LocalFarm(FarmConfig(pool=PoolConfig(warm=2))) as farm:
        browser.get(farm.url + "/")  # redirects to /status
        assert browser.current_url.endswith("/status")
        wait_for("the three bundled envs", lambda: all(cells(browser, e) for e in BUNDLED))
        before = {e: cells(browser, e) for e in BUNDLED}
        assert all(row["calls_per_s"] == "0.0" and row["leased"] == "0" and row["p50_ms"] == "–"
                   for row in before.values()), before
        assert browser.find_element("id", "replica-count").text == "1"

        with SyncFarm(farm.url) as sdk:
            leases = {env: sdk.acquire(env) for env in BUNDLED}
            for _ in range(15):
                for env, lease in leases.items():
                    step = bundled_catalog[env].solutions[0][0]  # a read: search or list
                    assert lease.call_result(step.tool, step.arguments).ok
            assert not leases[BUNDLED[0]].call_result("no_such_tool").ok  # an agent_error

            def after_burst() -> dict[str, dict[str, str]] | None:
                rows = {e: cells(browser, e) for e in BUNDLED}
                done = all(float(r["calls_per_s"]) > 0 and r["leased"] == "1"
                           and r["p50_ms"] != "–" for r in rows.values())
                # The last call of the burst (the agent_error) is on the page too.
                return rows if done and rows[BUNDLED[0]]["agent_error"] != "0.0 %" else None

            rows = wait_for("the burst's calls", after_burst)
            share = float(rows[BUNDLED[0]]["agent_error"].removesuffix(" %"))
            assert share == pytest.approx(100 / 16, abs=0.06)  # 1 of its 16 calls
            assert rows[BUNDLED[1]]["agent_error"] == "0.0 %"
            assert float(browser.find_element("id", "total-calls").text) > 0
            assert browser.find_element("id", "total-leases").text == "3"
            # three types, loaded at start (on-demand loading begins above 16)
            assert browser.find_element("id", "types").text == "3 / 0 / 0"
            owner = leases[BUNDLED[0]].lease_id.split("-")[0]
            assert browser.find_elements("css selector", f"tr[data-owner='{owner}']")
            shot = os.environ.get("ENVFARM_STATUS_SCREENSHOT")
            if shot:
                time.sleep(3)  # a few more polls, so the sparklines show the burst
                Path(shot).parent.mkdir(parents=True, exist_ok=True)
                browser.save_screenshot(shot)
            for lease in leases.values():
                lease.release()
        wait_for("the released leases", lambda: all(
            cells(browser, e)["leased"] == "0" for e in BUNDLED))


def test_status_page_lists_quarantined_tasks_until_lifted(browser, bundled_catalog, tmp_path):
    """A task flagged at load (gen_probes.jsonl beside the catalog) shows on the page with why,
    and leaves it once lifted."""
    import json
    import shutil as sh

    from envfarm.catalog import BUNDLED_CATALOG, verifier_sha256

    env = BUNDLED[0]
    sh.copytree(BUNDLED_CATALOG / env, tmp_path / env)
    (tmp_path / "gen_probes.jsonl").write_text(json.dumps({
        "scenario": env, "task_idx": 4, "path": "code", "hacked": ["echo"], "undecided": [],
        "summary": "code path: echo", "verifier_sha256": verifier_sha256(bundled_catalog[env], 4)}) + "\n")
    with LocalFarm(FarmConfig(catalog=str(tmp_path), envs=[env], pool=PoolConfig(warm=1))) as farm:
        browser.get(farm.url + "/status")
        row = f"tr[data-quarantine='{env}:4']"
        wait_for("the flagged task", lambda: browser.find_elements("css selector", row))
        text = browser.find_element("css selector", row).text
        assert "flagged" in text and "echo" in text
        with SyncFarm(farm.url) as sdk:
            assert [q.task_idx for q in sdk.lift_quarantine(env, 4)] == [4]
        wait_for("the lifted task gone", lambda: not browser.find_elements("css selector", row))
        assert "(none)" in browser.find_element("id", "quarantine-count").text
