"""The viewer in a real browser: Debian's Chromium, headless, driven by Selenium through chromedriver.

The viewer serves, on 127.0.0.1 and a free port, a run directory and an evaluation built from real code paths
(``fixtures.viewer_data``: a real run directory needs a verl run, so its steps are written by the trainer's own
record writer from rows that ``StrandsAgentLoop`` produced and verl's v1 worker stored; the episodes file is a
real ``AgentWorkflowEngine`` evaluation against the scripted OpenAI-compatible server). Chromium follows the links
from ``/`` and finds the steps, the task's own text, the agent's tool, the rewards and the trained tokens; its
performance log lists every request the pages made, and none leaves 127.0.0.1.

Needs ``apt-get install chromium chromium-driver`` (``.ci/run`` installs them as root) and ``selenium`` (the
``dev`` extra); skipped, saying which is missing, without them. ``RLLM_VIEWER_SCREENSHOT=docs/images/viewer.png``
saves the episode page's screenshot there (the manual's picture).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.viewer_data import TRAIN_QUESTION
from rllm.viewer import create_app, open_source

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (it is in the dev extra)")
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
                                       "chromium-driver); .ci/run installs them when it runs as root")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def viewer(run_dir: Path) -> Iterator[str]:
    """The viewer serving the run directory on 127.0.0.1, in a thread; its base URL."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(open_source(run_dir)), host="127.0.0.1", port=port,
                                          log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the viewer did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium with its performance log (every network request) on."""
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-default-apps", "--disable-sync"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


def _requested(driver: Any) -> list[str]:
    """The URLs of every request the browser sent since the last call (Chrome's performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_pages_linked_from_the_start_render_in_chromium_and_nothing_leaves_127_0_0_1(viewer: str, browser: Any,
                                                                                         tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    started = time.perf_counter()
    browser.get(viewer + "/")
    assert browser.execute_script("return document.readyState") == "complete"
    assert time.perf_counter() - started < 5, "the first page took 5 s or more"
    assert browser.find_element(By.CSS_SELECTOR, "#curves svg polyline")  # the reward curve, drawn
    steps = [link.get_attribute("href") for link in browser.find_elements(By.CSS_SELECTOR, "a.step-link")]
    assert steps == [viewer + "/step/1", viewer + "/step/2"]
    # CSS and JS came from the viewer itself: the trained-token style applies.
    assert browser.execute_script("return getComputedStyle(document.body).fontFamily").startswith("system-ui")

    browser.find_element(By.CSS_SELECTOR, "a.step-link").click()
    assert browser.current_url == viewer + "/step/1"
    assert TRAIN_QUESTION in browser.find_element(By.ID, "episodes").text
    rewards = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#episodes td.reward")]
    assert rewards == ["1", "0"]
    browser.find_elements(By.CSS_SELECTOR, "a.episode-link")[1].click()
    assert browser.current_url == viewer + "/step/1/episode/1"
    assert browser.find_element(By.ID, "task").text == TRAIN_QUESTION
    assert browser.find_element(By.ID, "reward").text == "0.0" and browser.find_element(By.ID, "advantage").text == "-1.0"
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".tool-name")] == ["lookup"]
    trained = browser.find_elements(By.CSS_SELECTOR, ".sample .response .tok-trained")
    masked = browser.find_elements(By.CSS_SELECTOR, ".sample .response .tok-masked")
    assert trained and masked
    assert "\\boxed{Lyon}" in "".join(t.get_attribute("textContent") for t in trained)
    assert "The entry for France" in "".join(t.get_attribute("textContent") for t in masked)
    assert "logprob" in trained[0].get_attribute("title") and "advantage -1" in trained[0].get_attribute("title")
    background = [browser.execute_script("return getComputedStyle(arguments[0]).backgroundColor", t)
                  for t in (trained[0], masked[0])]
    assert background[0] != background[1], "trained and masked tokens look alike"
    browser.execute_script("document.querySelector('#conversation .thread h3').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "viewer.png"))
    if os.environ.get("RLLM_VIEWER_SCREENSHOT"):
        shutil.copy(tmp_path / "viewer.png", os.environ["RLLM_VIEWER_SCREENSHOT"])

    browser.get(viewer + "/")
    browser.find_element(By.CSS_SELECTOR, "a.eval-link").click()
    assert browser.current_url == viewer + "/eval/episodes.jsonl"
    search = browser.find_element(By.ID, "search")
    search.send_keys("peru")
    search.submit()
    rows = browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")
    assert len(rows) == 2 and all("What is the capital of peru?" in row.text for row in rows)
    assert sorted(cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#episodes td.reward")) == ["0", "1"]
    browser.find_element(By.CSS_SELECTOR, "a.episode-link").click()
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".tool-name")] == ["capital_lookup"]
    browser.get(viewer + "/step/7")
    assert browser.find_element(By.ID, "error-detail").text.startswith("no step '7'")

    requested = _requested(browser)
    assert any(url.endswith("/static/viewer.css") for url in requested)
    assert any(url.endswith("/static/viewer.js") for url in requested)
    outside = [url for url in requested if not url.startswith(viewer + "/") and not url.startswith(("data:", "about:"))]
    assert not outside, f"requests left 127.0.0.1: {outside}"
