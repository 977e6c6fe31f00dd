"""HotpotQA for verl: the data script's files load with ``load_hotpotqa`` and verl's ``RLHFDataset``,
the Hugging Face rows convert to the original schema, and the reward scores the final answer only.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from rllm.agents.search import SEARCH_SYSTEM_PROMPT, score_search_answer, search_row_reward  # noqa: E402
from rllm.data import (  # noqa: E402
    SHIPPED_HOTPOTQA,
    hf_to_hotpotqa,  # noqa: E402
    hotpotqa_paragraphs,
    load_hotpotqa,
)
from rllm.errors import ConfigurationError  # noqa: E402
from rllm.offline.tiny_models import build_tiny_tokenizer  # noqa: E402
from rllm.rewards.base import score_answer  # noqa: E402
from rllm.training.verl._dotted import import_object  # noqa: E402
from rllm.training.verl.reward import reward_numbers  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts"))
import prepare_hotpotqa  # noqa: E402


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hotpotqa")
    prepare_hotpotqa.main(["--from-jsonl", str(SHIPPED_HOTPOTQA), "--val-size", "20", "--out-dir", str(out)])
    return out


def test_jsonl_splits_keep_the_original_schema(prepared: Path) -> None:
    shipped = load_hotpotqa()
    train, val = load_hotpotqa(prepared / "train.jsonl"), load_hotpotqa(prepared / "validation.jsonl")
    assert train + val == shipped and len(val) == 20
    first = json.loads((prepared / "train.jsonl").read_text().splitlines()[0])
    assert set(first) >= {"_id", "question", "answer", "type", "level", "supporting_facts", "context"}
    # The retrieval corpus covers the paragraphs of both splits, each once.
    corpus = [json.loads(line) for line in (prepared / "corpus.jsonl").read_text().splitlines()]
    expected = hotpotqa_paragraphs()
    assert [(p["title"], p["text"]) for p in corpus] == [(p["title"], p["text"]) for p in expected]
    assert [p["id"] for p in corpus] == [str(i) for i in range(len(corpus))]


def test_parquet_rows_load_with_verls_dataset(prepared: Path) -> None:
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1024, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1, "return_raw_chat": True,
                               "cache_dir": str(prepared / "cache"), "apply_chat_template_kwargs": {}})
    dataset = RLHFDataset(str(prepared / "validation.parquet"), build_tiny_tokenizer(), config)
    tasks = load_hotpotqa(prepared / "validation.jsonl")
    assert len(dataset) == len(tasks) == 20  # none filtered as over-long

    item = dataset[3]
    task = tasks[3]
    assert item["raw_prompt"] == [{"role": "system", "content": SEARCH_SYSTEM_PROMPT},
                                  {"role": "user", "content": task["question"]}]
    assert item["data_source"] == "hotpotqa" and item["agent_name"] == "strands_agent"
    assert item["reward_model"] == {"style": "rule", "ground_truth": task["answer"]}
    assert item["index"] == 3 and item["extra_info"]["id"] == task["id"]
    assert item["extra_info"]["split"] == "validation"
    batch = collate_fn([dataset[i] for i in range(4)])
    assert list(batch["agent_name"]) == ["strands_agent"] * 4 and list(batch["index"]) == [0, 1, 2, 3]

    frame = pd.read_parquet(prepared / "train.parquet")
    assert len(frame) == 80 and list(frame["extra_info"].map(lambda e: e["index"])) == list(range(80))


def test_hugging_face_rows_convert_to_the_original_schema() -> None:
    hf_row = {
        "id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "answer": "yes", "type": "comparison", "level": "hard",
        "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood"], "sent_id": [0, 0]},
        "context": {"title": ["Ed Wood", "Scott Derrickson"],
                    "sentences": [["Edward Davis Wood Jr. was an American filmmaker."],
                                  ["Scott Derrickson is an American director.", " He lives in LA."]]},
    }
    row = hf_to_hotpotqa(hf_row)
    assert row["_id"] == hf_row["id"]
    assert row["supporting_facts"] == [["Scott Derrickson", 0], ["Ed Wood", 0]]
    assert row["context"][1] == ["Scott Derrickson", ["Scott Derrickson is an American director.", " He lives in LA."]]


def test_download_fails_with_a_clear_message_offline(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "prepare_hotpotqa.py"), "--out-dir",
                             str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1
    assert "could not fetch hotpotqa/hotpot_qa (distractor, train) from the Hugging Face hub" in result.stderr
    assert "python scripts/prepare_hotpotqa.py --from-jsonl" in result.stderr
    assert not (tmp_path / "out").exists()


def search_row(ground_truth: Any, **extra_info: Any) -> dict[str, Any]:
    """A HotpotQA verl row as the loop hands it to ``rllm.reward_fn`` (no task of the user's inside)."""
    return {"data_source": "hotpotqa", "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"index": 0, "id": "q0", **extra_info}}


def recipe_numbers(ground_truth: Any, final_answer: str) -> dict[str, float]:
    """What verl logs for a rollout of two tool calls scored by the HotpotQA recipe's ``rllm.reward_fn``."""
    reward = asyncio.run(score_answer(search_row_reward, search_row(ground_truth), final_answer))
    return reward_numbers(reward, tool_calls=2)


def test_a_scorers_non_finite_score_is_refused_naming_the_task() -> None:
    nan_score = import_object("fixtures.user_agents:nan_score")
    with pytest.raises(ConfigurationError, match=r"reward function nan_score returned nan; it returns a RewardOutput "
                                                 r"or a finite number \(scoring task id='q0'"):
        asyncio.run(score_answer(nan_score, search_row("Paris"), "Paris"))


def test_reward_scores_the_final_answer_never_the_tool_output() -> None:
    # The loop hands the reward the final answer alone (the tool output is never in it: test_agent_loop).
    right = recipe_numbers("Paris", "It is \\boxed{paris}.")
    assert right == {"score": 1.0, "correct": 1.0, "f1": 1.0, "boxed": 1.0, "tool_calls": 2.0}
    unanswered = recipe_numbers("Paris", "I don't know.")
    assert unanswered["score"] == 0.0 and unanswered["boxed"] == 0.0
    aliases = recipe_numbers(pd.Series(["Paris", "City of Paris"]).to_numpy(), "\\boxed{City of Paris}")
    assert aliases["score"] == 1.0  # a list of aliases read back from parquet
    # The recipe rewards exact match only (F1 logged); the scorer's partial credit is still there for others.
    assert recipe_numbers("Paris, France", "\\boxed{Paris}")["score"] == 0.0
    partial = score_search_answer({"answer": "Paris, France"}, "\\boxed{Paris}", partial_credit=True)
    assert 0 < partial["score"] == partial["f1"] < 1 and partial["correct"] == 0.0
    with pytest.raises(ConfigurationError, match="has neither an 'answer' nor a reward_model.ground_truth"):
        search_row_reward({"index": 0}, "\\boxed{Paris}")  # the user's input: a KeyError before
