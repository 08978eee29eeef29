"""The live fleet page in a real browser (headless Chromium driven by selenium).

A gateway with control-plane keys fronts 4 fake SGLang engines; the page asks for a key, keeps it
for the tab, and follows the journal stream. A refit in which one engine fails its load runs
through the client; the table must show the new version on 3 engines and the quarantined one
(its reason as text), the refit timeline must gain the cycle with a time axis and a legend, and
the last operations list the refit and a fan-out with time, path, selector and result, once each. Slow rollouts in flight show in the in-flight column
(the data plane's counters), and leave it when they finish. ``.ci/run`` installs Debian's ``chromium`` and
``chromium-driver``; elsewhere the test skips saying what is missing. With
``SMGRL_FLEET_SCREENSHOT=PATH`` it saves a screenshot there (docs/fleet-page.png was made so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import urllib.request

import pytest

from smgrl.fake.checkpoint import make_checkpoint
from smgrl.rl import RL, RefitError

pytestmark = pytest.mark.e2e
ADMIN = "page-admin-key"


def _browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/run installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def rollout(base: str) -> None:
    """One rollout of ~4 s (100 tokens at the fakes' 40 ms per token)."""
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}
    req = urllib.request.Request(
        base + "/generate", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    urllib.request.urlopen(req, timeout=60).read()


def test_fleet_page_shows_versions_quarantine_and_the_refit_cycle(fakes, gateway, tmp_path):
    browser = _browser()
    from selenium.webdriver.common.by import By

    try:
        urls = fakes("sglang", 4, "--token-latency-ms", "40")
        _, _, port = gateway(
            "--enable-rl", "--disable-health-check", "--control-plane-api-keys", f"adm:admin:admin:{ADMIN}",
            "--worker-urls", *urls,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        rl = RL(base, api_key=ADMIN)
        wait_for(lambda: len(rl.workers()) == 4, what="4 workers")
        browser.get(base + "/fleet")
        form = wait_for(lambda: browser.find_element(By.ID, "keyform").is_displayed(), what="the key form")
        assert form
        browser.find_element(By.ID, "key").send_keys(ADMIN)
        browser.find_element(By.CSS_SELECTOR, "#keyform button").click()
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#fleet tbody tr")) == 4, what="4 rows")
        assert ADMIN not in browser.current_url

        def inflight():
            # One script: the rows are replaced whenever the table reloads (no stale elements).
            cells = browser.execute_script(
                "return [...document.querySelectorAll('#fleet tbody tr .inflight')].map(c => c.textContent)"
            )
            return [int(c) if c.isdigit() else None for c in cells]

        wait_for(lambda: inflight() == [0, 0, 0, 0], what="an idle fleet in the in-flight column")
        rollouts = [threading.Thread(target=rollout, args=(base,)) for _ in range(3)]
        for t in rollouts:
            t.start()
        try:
            wait_for(lambda: sum(n or 0 for n in inflight()) == 3, what="3 rollouts in flight")
        finally:
            for t in rollouts:
                t.join(60)
        wait_for(lambda: inflight() == [0, 0, 0, 0], what="the rollouts leaving the in-flight column")
        req = urllib.request.Request(
            urls[2] + "/_fake/knobs",
            data=json.dumps({"fail_loads_after_swap": 1}).encode(),  # weights changed: quarantined
            method="POST",
            headers={"content-type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=10).read()
        ckpt = str(make_checkpoint(tmp_path / "ckpt", "fake/model", seed=9))
        with pytest.raises(RefitError) as failed:
            rl.refit("engine=sglang", "9", model_path=ckpt)
        (bad,) = failed.value.engines

        def table():
            # One script: the rows are replaced whenever the table reloads (no stale elements).
            rows = browser.execute_script(
                "return [...document.querySelectorAll('#fleet tbody tr')].map(tr => [tr.dataset.workerId,"
                " tr.querySelector('.version').textContent, tr.querySelector('.quarantine').textContent])"
            )
            return {wid: (version, held) for wid, version, held in rows}

        rows = wait_for(
            lambda: (
                (t := table()) and t.get(bad, ("", ""))[1] and sum(v == "9" for v, _ in t.values()) == 3 and t
            ),
            what="the new version and the quarantine in the table",
        )
        assert "load failed" in rows[bad][1] and rows[bad][0] != "9"
        cycle = wait_for(
            lambda: browser.find_elements(By.CSS_SELECTOR, "#timeline g.cycle"), what="the refit cycle"
        )
        phases = {r.get_attribute("data-phase") for r in cycle[-1].find_elements(By.CSS_SELECTOR, "rect")}
        assert {"pause", "load", "resume"} <= phases
        assert "quarantined" in cycle[-1].text
        # The quarantine's reason is the cell's text, whole (no hover needed).
        (row,) = [w for w in rl.workers() if w.id == bad]
        reason = (row.extra.get("quarantine") or {}).get("reason")
        assert reason and rows[bad][1] == reason
        # The timeline has a time axis (5 ticks from 0) and a legend of the phases drawn.
        ticks = wait_for(
            lambda: browser.execute_script(
                "return [...document.querySelectorAll('#timeline g.axis text.tick')].map(t => t.textContent)"
            ),
            what="the time axis",
        )
        assert len(ticks) == 5 and ticks[0] == "0 ms" and all(t.endswith(("ms", " s")) for t in ticks)
        legend = browser.execute_script(
            "return [...document.querySelectorAll('#legend .item')].map(i => i.dataset.phase)"
        )
        assert {"pause", "load", "resume"} <= set(legend) and len(legend) == len(set(legend))
        # Last operations: time, what (the refit, a fan-out's method and path), selector and
        # result, one entry per operation.
        rl.fanout("model_info", method="GET", selector="engine=sglang")

        def operations():
            return browser.execute_script(
                "return [...document.querySelectorAll('#ops tbody tr')].map(tr => [tr.dataset.id,"
                " ...[...tr.cells].map(c => c.textContent)])"
            )

        ops = wait_for(
            lambda: (
                (o := operations()) and any(r[2:4] == ["GET model_info", "engine=sglang"] for r in o) and o
            ),
            what="the fan-out in the last operations",
        )
        assert len({r[0] for r in ops}) == len(ops)
        assert all(re.fullmatch(r"\d\d:\d\d:\d\d", r[1]) for r in ops)
        (refit,) = [r for r in ops if r[2] == "refit to 9"]
        assert refit[3] == "engine=sglang" and refit[4].startswith("quarantined (held out: ")
        (fan,) = [r for r in ops if r[2:4] == ["GET model_info", "engine=sglang"]]
        assert re.fullmatch(r"ok 4/4 in \d+ ms", fan[4])
        # The refit's own calls are listed under its id (their selector).
        assert any(r[3] == "refit:" + refit[0] for r in ops)
        shot = os.environ.get("SMGRL_FLEET_SCREENSHOT")
        if shot:
            browser.save_screenshot(shot)
    finally:
        browser.quit()
