"""How fast the viewer serves a big step and a big evaluation, timed over HTTP from outside (httpx).

Writes, in a temporary folder, a run directory with one step of 512 rollout records (``--rollouts``) and an
episodes JSONL of 10,000 episodes (``--episodes``), then starts the real viewer (``python -m rllm.viewer``, a
subprocess) on each and times, with httpx, one request at a time (render time, not throughput):

* the step: its first page (file order: only the page's lines read), the same sorted by reward (every line
  summarised once), sorted again (from the summaries kept), and one episode's page;
* the evaluation: from starting the viewer to its first page served (the file indexed by line offset, only
  the page parsed), a page deep in the file, and a search over every episode's task text.

The records are synthetic but built by the trainer's own writer (``build_records``: a conversation of four tool
turns per rollout, 2,048 response tokens each with its text piece), the episodes are ``rllm.types.Episode``
records with four steps each; their sizes are what a real 2-core CPU run writes, scaled up.

    python scripts/bench_viewer.py [--rollouts 512] [--episodes 10000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rllm.records import conversation
from rllm.training.verl.trainer.rollout_records import build_records, write_records
from rllm.types import Episode, ModelOutput, Step, ToolCall, Trajectory

TURNS = 4
RESPONSE_TOKENS = 2048
PROMPT_TOKENS = 300


def _steps(task: str, turns: int = TURNS) -> list[Step]:
    messages: list[dict] = [{"role": "system", "content": "Use the lookup tool, then answer in \\boxed{}."},
                            {"role": "user", "content": task}]
    steps = []
    for turn in range(turns):
        call = ToolCall.from_arguments(f"call-{turn}", "lookup", json.dumps({"key": f"box {turn}"}))
        last = turn == turns - 1
        output = ModelOutput(text="The answer is \\boxed{42}." if last else "", tool_calls=[] if last else [call])
        result = [{"role": "tool", "tool_call_id": call.id, "content": f"Box {turn} holds item {turn * 7}. " * 8}]
        steps.append(Step(messages=list(messages), model_output=output, observation=[] if last else result))
        messages += [{"role": "assistant", "content": output.text}, *([] if last else result)]
    return steps


def _run_dir(folder: Path, rollouts: int) -> Path:
    keys, columns = [], {name: [] for name in ("uid", "session_id", "prompts", "responses", "response_mask",
                                               "rollout_log_probs", "advantages", "rm_scores", "extra_fields")}
    for i in range(rollouts):
        task = f"Which item is in the box that box {i} names? (task {i})"
        reward = float(i % 3 == 0)
        record = json.dumps({"task": {"question": task},
                             "trajectories": [{"name": "agent", "conversation": conversation(_steps(task))}]})
        mask = [1 if (t // 64) % 2 == 0 else 0 for t in range(RESPONSE_TOKENS)]
        keys.append(f"g{i // 8}_{i % 8}_0")
        columns["uid"].append(f"g{i // 8}")
        columns["session_id"].append(i % 8)
        columns["prompts"].append(list(range(1000, 1000 + PROMPT_TOKENS)))
        columns["responses"].append([2000 + t % 5000 for t in range(RESPONSE_TOKENS)])
        columns["response_mask"].append(mask)
        columns["rollout_log_probs"].append([-0.25 * m for m in mask])
        columns["advantages"].append([(reward - 0.33) * m for m in mask])
        columns["rm_scores"].append([0.0] * (RESPONSE_TOKENS - 1) + [reward])
        columns["extra_fields"].append({"termination_reason": "finished", "final_answer": "\\boxed{42}",
                                        "rllm_conversation": record, "agent": "agent", "sample_index": 0})
    records = build_records(1, keys, columns, decode=lambda ids: [f"t{i % 97}" for i in ids])
    write_records(folder, 1, records)
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "data": {"critic/score/mean": 0.33}}) + "\n")
    return folder


def _episodes(path: Path, count: int) -> Path:
    with path.open("w", encoding="utf-8") as file:
        for i in range(count):
            task = {"id": f"q{i}", "question": f"What is in box {i}?"}
            episode = Episode(id=f"q{i}:0", task=task, reward=float(i % 2), termination_reason="finished",
                              trajectories=[Trajectory(name="agent", task=task, steps=_steps(task["question"]))])
            file.write(episode.model_dump_json() + "\n")
    return path


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(path: Path) -> tuple[subprocess.Popen, str, float]:
    """The real viewer on ``path``; its URL and the seconds until its first page was served."""
    port = _port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "rllm.viewer", str(path), "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            if httpx.get(url + "/", timeout=30).status_code == 200:
                return process, url, time.perf_counter() - started
        except httpx.TransportError:
            if process.poll() is not None or time.perf_counter() - started > 60:
                raise SystemExit(f"the viewer did not start on {path}") from None
            time.sleep(0.05)


def _time(client: httpx.Client, url: str, repeats: int) -> tuple[float, float]:
    """Seconds of the first request and the median of ``repeats`` more."""
    started = time.perf_counter()
    assert client.get(url).status_code == 200, url
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        assert client.get(url).status_code == 200, url
        times.append(time.perf_counter() - started)
    return first, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Write the data, serve it, print the timings as a Markdown table."""
    parse = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parse.add_argument("--rollouts", type=int, default=512)
    parse.add_argument("--episodes", type=int, default=10_000)
    parse.add_argument("--repeats", type=int, default=5)
    args = parse.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        run = _run_dir(Path(folder) / "run", args.rollouts)
        size = (run / "rollouts" / "step_000001.jsonl").stat().st_size
        process, url, startup = _serve(run)
        try:
            with httpx.Client(timeout=120) as client:
                for what, path in ((f"step of {args.rollouts}: first page", "/step/1"),
                                   (f"step of {args.rollouts}: sorted by reward", "/step/1?sort=reward&order=desc"),
                                   (f"step of {args.rollouts}: one episode", f"/step/1/episode/{args.rollouts - 1}")):
                    rows.append((what, *_time(client, url + path, args.repeats)))
        finally:
            process.terminate()
            process.wait(timeout=30)
        rows.append((f"run directory: viewer started to / served ({size / 1e6:.0f} MB step file)", startup, None))
        episodes = _episodes(Path(folder) / "episodes.jsonl", args.episodes)
        size = episodes.stat().st_size
        process, url, startup = _serve(episodes)
        try:
            rows.append((f"{args.episodes} episodes ({size / 1e6:.0f} MB): viewer started to first page served",
                         startup, None))
            with httpx.Client(timeout=120) as client:
                deep = args.episodes // 50 - 1
                for what, path in ((f"{args.episodes} episodes: page {deep}", f"/?page={deep}"),
                                   (f"{args.episodes} episodes: search of every task", "/?q=box%20999")):
                    rows.append((what, *_time(client, url + path, args.repeats)))
        finally:
            process.terminate()
            process.wait(timeout=30)
    print("| what | first request (s) | median of the next (s) |")  # noqa: T201
    print("| --- | ---: | ---: |")  # noqa: T201
    for what, first, median in rows:
        print(f"| {what} | {first:.3f} | {'' if median is None else f'{median:.3f}'} |")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
