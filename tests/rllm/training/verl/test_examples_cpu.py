"""The own-agent examples through verl's own trainer on CPU: two real RLOO steps, on exactly their samples.

``python -m rllm.training.verl.train --cpu`` on the shipped HotpotQA recipe, its agent replaced by a factory
(``rllm.agent_loop.agent_factory``) that gives each prompt's four rollouts four examples
(``fixtures.example_pairs``), against a real retrieval server (MiniLM index, bearer token):

* rollout 0, ``examples/strands/windowed_search_agent.py``: a user's plain ``strands.Agent`` with Strands'
  default ``SlidingWindowConversationManager()`` and whole passages: its second search overflows the
  context, Strands trims the history and retries, and the rollout continues in a new sample;
* rollout 1, ``examples/strands/own_client_search_agent.py``: the same plain ``strands.Agent`` on Strands'
  own streaming ``OpenAIModel`` and its own client (``rllm.agent_loop.own_client=true``): each verl worker
  serves it the policy over HTTP, and its samples must be rollout 0's, token for token;
* rollouts 2 and 3, ``examples/strands/search_team.py``: a Strands ``Graph`` of a researcher that searches
  and a writer that answers, one episode with one trajectory per node, and the same pair as a Strands
  ``Swarm`` (``search_swarm``: the researcher hands off to the writer with Strands' ``handoff_to_agent``), a
  trajectory per node that ran: a factory whose system prompt varies per rollout, whose groups train (the
  audit checks the row, not every token of the first prompt).

One run for the four (two until 2026-11-29), since every verl run costs CI its start-up. The rollout server
plays a scripted policy from outside rllm (``fixtures.verl_faults``: ``scripted_searches``: two searches per
agent, then an answer), since a random tiny model never calls a tool; the tokens are Qwen's real tokenizer
(first 8k ranks) and Qwen3's shipped template. Asserted: two steps done; the samples per rollout and per node;
the rows verl trained on exactly the samples the loop returned (tokens and loss mask); one advantage per
rollout on all its samples (``varied_score`` gives a prompt's rollouts 0 and 1 in turn: RLOO's +2/3 and -2/3,
where verl's own RLOO over rows would not).
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

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")
pytest.importorskip("verl", reason="verl is not installed: the examples' runs need the train extra")

from fixtures.example_pairs import GRAPH, OWN_CLIENT, SWARM, WINDOWED  # noqa: E402
from fixtures.shared_index import whole_passage_index  # noqa: E402

from rag.server import ServerSettings  # noqa: E402
from rag.testing import RetrievalServer  # noqa: E402
from rllm.agents.search import search_verl_rows  # noqa: E402
from rllm.data.hotpotqa import load_hotpotqa  # noqa: E402
from rllm.data.verl_rows import write_parquet  # noqa: E402
from rllm.offline.chat_templates import load_chat_template  # noqa: E402
from rllm.offline.qwen_tokenizer import QwenVocab, build_qwen_tokenizer  # noqa: E402
from rllm.offline.tiny_models import build_tiny_qwen3  # noqa: E402

REPO = Path(__file__).resolve().parents[4]
TESTS = REPO / "tests"
pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow(verl_runs=1)]

OVERRIDES = [
    "data.train_batch_size=2", "data.max_prompt_length=1024", "data.max_response_length=2048",
    "data.val_max_samples=2",
    # The context (1000) holds the prompt (about 230 tokens) and one search's whole passages (about 420), not two;
    # the prompt of a trimmed history (about 720) must fit data.max_prompt_length, since verl stores it as a row's.
    "actor_rollout_ref.rollout.max_model_len=1000",
    "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384",
    "trainer.total_training_steps=2", "trainer.total_epochs=2", "trainer.val_before_train=false",
    "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,file]",
    "rllm.agent_loop.tool_factory=null",
    "rllm.guards.max_logprob_gap=null",  # the scripted policy's log-probs are not the model's
    "rllm.reward_fn=fixtures.verl_faults:varied_score",
    "++ray_kwargs.ray_init.include_dashboard=false",
]


@dataclass
class Run:
    """What one example's run left: exit status, output, verl's metrics, and what crossed verl per rollout."""

    returncode: int
    output: str
    metrics: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    out: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Rows, a tiny model on Qwen's tokenizer, the index and a retrieval server behind a token, shared by the runs."""
    root = tmp_path_factory.mktemp("examples")
    tasks = load_hotpotqa()
    write_parquet(search_verl_rows(tasks[:2], "train"), root / "data" / "train.parquet")
    write_parquet(search_verl_rows(tasks[2:4], "validation"), root / "data" / "validation.parquet")
    tokenizer = build_qwen_tokenizer(load_chat_template("qwen3"), QwenVocab.QWEN_FIRST_8K)
    build_tiny_qwen3(tokenizer, root / "model", seed=0, hidden_size=64, num_layers=2)
    token = "tok-" + secrets.token_hex(8)
    with RetrievalServer(whole_passage_index(tmp_path_factory), ServerSettings(token=token)) as server:
        yield root, server.base_url, token


def _train(world: Any, factory: str, name: str, *overrides: str) -> Run:
    root, url, token = world
    out = root / name
    out.mkdir()
    ray_dir = tempfile.mkdtemp(prefix="rllm-ray-")  # short: Ray's socket paths must fit in 107 bytes
    env = {**os.environ, "RETRIEVAL_TOKEN": token, "RETRIEVAL_SERVER_URL": url, "HOTPOTQA_DIR": str(root / "data"),
           "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl"), "RAY_TMPDIR": ray_dir, "TOKENIZERS_PARALLELISM": "false",
           "VERL_USE_EXTERNAL_MODULES": "fixtures.verl_faults", "RLLM_TEST_FAULT": "scripted_searches",
           "RLLM_TEST_FAULT_DIR": str(out), "RAY_DEDUP_LOGS": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), str(REPO / "examples" / "strands"),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "rllm.training.verl.train", "--cpu", f"actor_rollout_ref.model.path={root / 'model'}",
         f"trainer.default_local_dir={out / 'checkpoints'}", f"hydra.run.dir={out / 'hydra'}",
         f"rllm.agent_loop.agent_factory={factory}", *OVERRIDES, *overrides],
        cwd=out, env=env, capture_output=True, text=True, timeout=900)
    (out / "output.log").write_text(proc.stdout + proc.stderr)

    def lines(pattern: str) -> list[dict[str, Any]]:
        return [json.loads(line) for path in out.glob(pattern) for line in path.read_text().splitlines()]

    return Run(proc.returncode, proc.stdout + proc.stderr, [m["data"] for m in lines("metrics.jsonl")],
               [s for s in lines("samples-*.jsonl") if not s["validate"]], [r for r in lines("rows-*.jsonl")
                                                                          if not r["padding"]], out)


def _tokenizer(run: Run) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run.out.parent / "model")


def _per_rollout(run: Run) -> dict[str, list[dict[str, Any]]]:
    rollouts: dict[str, list[dict[str, Any]]] = {}
    for sample in sorted(run.samples, key=lambda s: s["index"]):
        rollouts.setdefault(sample["rollout"], []).append(sample)
    return rollouts


def _of(run: Run, *sessions: str) -> dict[str, list[dict[str, Any]]]:
    """The samples of the rollouts that ran the examples of ``sessions`` (``fixtures.example_pairs``)."""
    return {rollout: samples for rollout, samples in _per_rollout(run).items()
            if rollout.rpartition("_")[2] in sessions}


def _sampled_tool_calls(tokenizer: Any, samples: list[dict[str, Any]]) -> int:
    """The ``<tool_call>`` tokens the policy sampled in a rollout's samples (loss mask 1)."""
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    return sum(token == call and bit == 1 for s in samples
               for token, bit in zip(s["ids"][len(s["ids"]) - len(s["mask"]):], s["mask"], strict=True))


@pytest.fixture(scope="module")
def run(world: Any) -> Run:
    return _train(world, "fixtures.example_pairs:four_examples", "examples", "rllm.agent_loop.own_client=true")


def test_the_four_examples_trained_on_exactly_their_samples_once_per_rollout(run: Run) -> None:
    assert run.returncode == 0, run.output[-4000:]
    assert [m["training/global_step"] for m in run.metrics] == [1, 2]
    assert len(_per_rollout(run)) == 2 * 2 * 4  # 2 steps x 2 prompts x 4 rollouts
    # The rows verl trained on are exactly the samples the loop returned: tokens and loss mask, each once.
    assert sorted((r["ids"], r["mask"]) for r in run.rows) == sorted((s["ids"], s["mask"]) for s in run.samples)
    # One advantage per rollout (RLOO over rollouts, not rows), on every sampled token of each of its samples.
    by_rollout: dict[tuple[int, str], set[float]] = {}
    for row in run.rows:
        by_rollout.setdefault((row["step"], row["key"].rpartition("_")[0]), set()).update(
            round(a, 6) for a in row["advantages"])
    assert all(len(values) == 1 for values in by_rollout.values()), by_rollout
    assert {value for values in by_rollout.values() for value in values} == {round(2 / 3, 6), round(-2 / 3, 6)}
    # verl counted every rollout that went on in a new sample, the windowed ones among them.
    step_of = {row["key"].rpartition("_")[0]: row["step"] for row in run.rows}
    per_step = [sum(len(samples) > 1 for rollout, samples in _per_rollout(run).items() if step_of[rollout] == step)
                for step in (1, 2)]
    assert [m["rllm/guard/split_rollouts"] for m in run.metrics] == per_step


def test_a_plain_strands_agent_whose_history_strands_trims_trains_on_its_samples(run: Run) -> None:
    windowed = _of(run, WINDOWED, OWN_CLIENT)
    assert len(windowed) == 2 * 2 * 2
    # Every rollout overflowed once: the trimmed history continues in a second sample.
    assert {len(samples) for samples in windowed.values()} == {2}, {k: len(v) for k, v in windowed.items()}
    tokenizer = _tokenizer(run)
    assert {_sampled_tool_calls(tokenizer, samples) for samples in windowed.values()} == {2}  # two searches each


def test_a_researcher_writer_graph_and_swarm_train_as_one_episode_with_a_sample_per_node(run: Run) -> None:
    tokenizer = _tokenizer(run)
    team = _of(run, GRAPH, SWARM)
    kinds = []
    for rollout, samples in team.items():
        agents = [s["agent"] for s in samples]  # the researcher's second search may overflow: a second sample
        assert list(dict.fromkeys(agents)) == ["researcher", "writer"] and agents[-1] == "writer", rollout
        researcher = "".join(tokenizer.decode(s["ids"]) for s in samples if s["agent"] == "researcher")
        swarm = '"name": "handoff_to_agent"' in researcher  # the Swarm's researcher handed over with Strands' tool
        assert not swarm or "Handing off to writer" in researcher
        assert swarm == (rollout.rpartition("_")[2] == SWARM), rollout
        kinds.append("swarm" if swarm else "graph")
    assert sorted(kinds) == ["graph"] * 4 + ["swarm"] * 4  # per step, each prompt's rollouts 2 and 3
    # A group's Graph and Swarm rollouts began from different first prompts (the Swarm's researcher has its
    # hand-off tool in its system prompt), yet verl grouped them and the audit let both steps train.
    firsts: dict[str, set[tuple[int, ...]]] = {}
    for rollout, samples in team.items():
        first = samples[0]
        firsts.setdefault(rollout.rpartition("_")[0], set()).add(tuple(first["ids"][: len(first["ids"])
                                                                                      - len(first["mask"])]))
    assert len(firsts) == 2 * 2 and all(len(prompts) == 2 for prompts in firsts.values())
    assert all(m["rllm/guard/group_violations"] == 0 for m in run.metrics)


def test_the_same_agent_on_its_own_openai_client_trains_on_the_same_samples(run: Run) -> None:
    # Each prompt's rollout 1 ran the windowed agent on Strands' OpenAIModel and its own client, served by
    # the worker over HTTP (its overflow a 400 context_length_exceeded, which Strands trims and retries);
    # rollout 0 ran it on the rollout's model. The policy answers by the prompt: the samples are the same.
    pairs: dict[str, dict[str, list[tuple[list[int], list[int]]]]] = {}
    for rollout, samples in _of(run, WINDOWED, OWN_CLIENT).items():
        uid, _, session = rollout.rpartition("_")
        pairs.setdefault(uid, {})[session] = [(s["ids"], s["mask"]) for s in samples]
    assert len(pairs) == 2 * 2 and all(set(pair) == {WINDOWED, OWN_CLIENT} for pair in pairs.values()), pairs.keys()
    assert all(pair[WINDOWED] == pair[OWN_CLIENT] for pair in pairs.values())
    built = [line for path in run.out.glob("own-client-*.txt") for line in path.read_text().splitlines()]
    assert len(built) == 2 * 2 and all(url.startswith("http://127.0.0.1:") for url in built), built
