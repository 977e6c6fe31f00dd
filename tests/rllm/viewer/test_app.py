"""The viewer's pages over HTTP (Starlette's test client): what each shows, how it fails, how it pages.

The run directory and the evaluation are built from real code paths (``fixtures.viewer_data``); the
browser test (``test_browser.py``) drives the same pages in Chromium.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fixtures.viewer_data import TRAIN_QUESTION
from rllm.viewer import create_app, open_source
from rllm.viewer.sources import JsonlIndex, NotServable

REPO = Path(__file__).resolve().parents[3]


def test_the_run_page_shows_curves_guards_steps_and_the_evaluation(run_dir: Path) -> None:
    page = TestClient(create_app(open_source(run_dir))).get("/")

    assert page.status_code == 200
    assert 'data-key="critic/score/mean"' in page.text and "<polyline" in page.text
    assert "rllm/guard/tool_calls_per_episode" in page.text
    assert re.findall(r'href="(/step/\d+)"', page.text) == ["/step/1", "/step/2"]
    assert "0.5000" in page.text and "0.7500" in page.text  # each step's mean reward, from metrics.jsonl
    assert 'href="/eval/episodes.jsonl"' in page.text


def test_a_step_lists_its_rollouts_and_an_episode_shows_conversation_and_trained_tokens(run_dir: Path) -> None:
    client = TestClient(create_app(open_source(run_dir)))

    step = client.get("/step/2")
    assert step.status_code == 200 and step.text.count('class="episode-link"') == 4
    assert TRAIN_QUESTION in step.text
    worst = client.get("/step/2?sort=reward&order=asc").text
    assert re.search(r'episode/(\d+)"', worst).group(1) == "2"  # the wrong answer first
    episode = client.get("/step/2/episode/2").text
    assert TRAIN_QUESTION in episode and "Lyon" in episode and 'class="tool-name">lookup<' in episode
    assert '<div class="msg role-tool">' in episode and "The entry for France says" in episode
    trained = re.findall(r'<span class="tok tok-trained" title="([^"]+)">', episode)
    assert trained and all("logprob" in title and "advantage -" in title for title in trained)
    assert 'class="tok tok-masked"' in episode


def test_the_evaluation_shows_the_agents_tool_and_rewards(run_dir: Path) -> None:
    client = TestClient(create_app(open_source(run_dir)))

    listing = client.get("/eval/episodes.jsonl")
    assert listing.status_code == 200 and "What is the capital of peru?" in listing.text
    assert listing.text.count('class="episode-link"') == 6
    found = client.get("/eval/episodes.jsonl?q=PERU").text
    assert found.count('class="episode-link"') == 2 and "france" not in found
    episode = client.get("/eval/episodes.jsonl/episode/0").text
    assert 'class="tool-name">capital_lookup<' in episode and "The capital is \\boxed{Paris}." in episode


def test_an_episodes_file_is_served_on_its_own(run_dir: Path) -> None:
    client = TestClient(create_app(open_source(run_dir / "episodes.jsonl")))

    home = client.get("/")
    assert home.status_code == 200 and home.text.count('class="episode-link"') == 6
    assert client.get("/eval/episodes.jsonl/episode/5").status_code == 200


@pytest.mark.parametrize("url", ["/step/9", "/step/1/episode/7", "/step/x/episode/y", "/eval/nope.jsonl",
                                 "/step/1/episode/-1", "/nothing/here"])
def test_an_unknown_step_or_episode_is_a_404_page(run_dir: Path, url: str) -> None:
    page = TestClient(create_app(open_source(run_dir)), raise_server_exceptions=False).get(url)
    assert page.status_code == 404 and "<h1 class=\"error\">404</h1>" in page.text


def test_a_path_that_is_neither_is_refused_naming_it_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello\n")
    for path in (tmp_path / "notes.txt", tmp_path / "missing", tmp_path):
        with pytest.raises(NotServable, match=re.escape(str(path))):
            open_source(path)
    done = subprocess.run([sys.executable, "-m", "rllm.viewer", str(tmp_path / "notes.txt")], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2 and str(tmp_path / "notes.txt") in done.stderr


def test_a_large_file_is_indexed_by_line_and_only_the_page_shown_is_parsed(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "episodes.jsonl"
    line = {"id": "t:0", "task": {"question": "q"}, "trajectories": [], "reward": 1.0}
    path.write_text("".join(json.dumps({**line, "id": f"t{i}:0"}) + "\n" for i in range(2000)), encoding="utf-8")
    parsed: list[int] = []
    loads = json.loads
    monkeypatch.setattr("rllm.viewer.sources.json.loads", lambda text: parsed.append(1) or loads(text))

    page = TestClient(create_app(open_source(path))).get("/?page=3")

    assert page.status_code == 200 and page.text.count('class="episode-link"') == 50
    assert 'href="/eval/episodes.jsonl/episode/100"' in page.text
    assert len(parsed) <= 51  # the first line (what the file is) and the page's 50
    index = JsonlIndex(path)
    assert len(index) == 2000 and index.read(1999)["id"] == "t1999:0"
    with path.open("a", encoding="utf-8") as file:  # an evaluation still writing
        file.write(json.dumps({**line, "id": "late:0"}) + "\n")
    assert len(index) == 2001 and index.read(2000)["id"] == "late:0"


def test_the_quickstarts_layout_its_flat_metrics_and_steps_under_checkpoints(run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "rollouts").mkdir(parents=True)
    (tmp_path / "checkpoints" / "rollouts" / "step_000003.jsonl").write_bytes(
        (run_dir / "rollouts" / "step_000001.jsonl").read_bytes())
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 3, "reward": 0.25, "eval_reward": 0.5}) + "\n")

    page = TestClient(create_app(open_source(tmp_path))).get("/")

    assert re.findall(r'href="(/step/\d+)"', page.text) == ["/step/3"] and "0.2500" in page.text
    assert 'data-key="reward"' in page.text and 'data-key="eval_reward"' in page.text
