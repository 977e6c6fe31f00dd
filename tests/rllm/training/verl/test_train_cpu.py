"""The shipped HotpotQA recipe through verl 0.9.1's own trainer, for real, on this CPU: two RLOO steps.

``python -m rllm.training.verl.train --cpu`` with the shipped recipe and overrides that only size it
for a CPU (a tiny model, short responses, 2 prompts x 4 rollouts, 2 steps): verl's v1 trainer on
Ray (TransferQueue, FSDP2 actor, the checkpoint manager's weight sync, RLOO) drives
``StrandsAgentLoop`` + ``StrandsAgentLoopManager`` through the embedded rollout backend, the
recipe's own tools (``local_search`` against a real retrieval server with the real MiniLM index,
behind a bearer token) and the recipe's own reward. The policy is a tiny Qwen3 on Qwen's tokenizer
warm-started on search demonstrations for two yes/no questions (``fixtures.search_policy``), because a
random one never calls a tool. What is asserted is what would show that training is not real: both steps done; a
search reached the server (authenticated); the rollout's log-probs are the actor's (gap < 1e-3);
the served weights are the actor's after every sync (checksum); the reward varies within a group;
and the token appears in none of the run's output or files.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from rag.server import ServerSettings
from rag.testing import RetrievalServer
from rllm.agents.search import search_verl_rows
from rllm.data.hotpotqa import load_hotpotqa
from rllm.data.verl_rows import write_parquet

REPO = Path(__file__).resolve().parents[4]
pytestmark = [pytest.mark.timeout(1500), pytest.mark.slow(verl_runs=1)]

STEPS = 2
OVERRIDES = [
    "data.train_batch_size=2",
    "data.max_prompt_length=1024",
    "data.max_response_length=512",
    "data.val_max_samples=2",
    "actor_rollout_ref.rollout.max_model_len=1536",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=8192",
    "+rllm.agent_loop.tool_kwargs.max_chars=300",
    f"trainer.total_training_steps={STEPS}",
    f"trainer.total_epochs={STEPS}",  # one batch of the two training questions per epoch
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[console,file]",
]
"""Only what sizes the recipe for a 2-core CPU (plus the model path and the data, given below)."""


@dataclass
class Run:
    """What one real training run left behind."""

    returncode: int
    output: str
    metrics: list[dict[str, Any]]
    queries_during_training: int
    root: Path
    token: str


def _searches(server: RetrievalServer, token: str) -> int:
    """``POST /retrieve`` requests the server answered (cache hits included), read with the token."""
    answer = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    answer.raise_for_status()
    return int(answer.json()["requests"].get("retrieve", 0))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    from fixtures.search_policy import warm_started_search_policy, yes_no_tasks
    from fixtures.shared_index import whole_passage_index

    root = tmp_path_factory.mktemp("verl-cpu")
    token = "tok-" + secrets.token_hex(12)
    data = root / "data"
    questions = yes_no_tasks(load_hotpotqa())
    tasks, held_out = questions[:2], questions[2:4]  # a yes and a no question to train on
    write_parquet(search_verl_rows(tasks, "train"), data / "train.parquet")
    write_parquet(search_verl_rows(held_out, "validation"), data / "validation.parquet")
    with RetrievalServer(whole_passage_index(tmp_path_factory), ServerSettings(token=token)) as server:
        policy = warm_started_search_policy(root / "policy", tasks, retrieval_url=server.base_url, token=token)
        before = _searches(server, token)
        work = root / "work"
        work.mkdir()
        ray_dir = Path(tempfile.mkdtemp(prefix="rllm-ray-"))  # short: Ray's socket paths must fit in 107 bytes
        (root / "ray").symlink_to(ray_dir)  # scanned for the token with the rest of the run's files
        env = {**os.environ, "RETRIEVAL_TOKEN": token, "RETRIEVAL_SERVER_URL": server.base_url,
               "HOTPOTQA_DIR": str(data), "VERL_FILE_LOGGER_PATH": str(root / "metrics.jsonl"),
               "RAY_TMPDIR": str(ray_dir), "OTEL_SDK_DISABLED": "true", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(
            [sys.executable, "-m", "rllm.training.verl.train", "--cpu", f"actor_rollout_ref.model.path={policy}",
             f"trainer.default_local_dir={root / 'checkpoints'}", *OVERRIDES],
            cwd=work, env=env, capture_output=True, text=True, timeout=1200)
        after = _searches(server, token)
    (root / "output.log").write_text(proc.stdout + proc.stderr)  # kept for a failing run's reader
    metrics_file = root / "metrics.jsonl"
    metrics = [json.loads(line)["data"] for line in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
    return Run(proc.returncode, proc.stdout + proc.stderr, metrics, after - before, root, token)


def test_both_steps_of_the_recipe_complete(run: Run) -> None:
    assert run.returncode == 0, run.output[-6000:]
    assert [m["training/global_step"] for m in run.metrics] == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert f"step {step} guards:" in run.output  # the guards are printed on every step


def test_the_policy_searched_and_the_authenticated_search_reached_the_server(run: Run) -> None:
    assert run.queries_during_training > 0  # 200s only: without the token the server answers 401 and the run stops
    assert max(m["rllm/guard/tool_calls_per_episode"] for m in run.metrics) > 0


def test_the_rollout_sampled_with_the_actors_log_probs_at_every_step(run: Run) -> None:
    for m in run.metrics:
        assert m["rllm/guard/logprob_gap_max"] < 1e-3, m["rllm/guard/logprob_gap_max"]
        # The recipe trains against the sampler's log-probs (bypass mode): verl recomputes none, the gap guard's
        # audit has the actor recompute some (all 8 here: logprob_audit_rollouts 16 > 2 prompts x 4 rollouts).
        assert "training/rollout_probs_diff_max" not in m and m["rllm/guard/logprob_gap_rollouts"] == 8


def test_the_served_weights_are_the_actors_after_every_sync(run: Run) -> None:
    for m in run.metrics:
        assert m["rllm/weights/fingerprint_match"] == 1.0  # the server's fingerprint against the actor's own
        assert m["rllm/weights/version"] == m["training/global_step"]  # synced after this step's update
    assert run.metrics[-1]["rllm/weights/changed"] == 1.0  # the update changed what is served


def test_the_reward_varies_within_a_group_in_some_step(run: Run) -> None:
    assert max(m["rllm/guard/groups_with_signal_share"] for m in run.metrics) > 0
    assert all(m["rllm/guard/min_group_size"] == 4 for m in run.metrics)


def test_the_retrieval_token_is_in_no_output_and_no_file_of_the_run(run: Run) -> None:
    assert run.token not in run.output
    leaked = []
    files = [*run.root.rglob("*"), *(run.root / "ray").resolve().rglob("*")]  # Ray's session logs included
    for path in files:
        if path.is_file() and not path.is_symlink():
            try:
                if run.token.encode() in path.read_bytes():
                    leaked.append(str(path))
            except OSError:
                continue
    assert not leaked, f"the retrieval token was written to {leaked}"
