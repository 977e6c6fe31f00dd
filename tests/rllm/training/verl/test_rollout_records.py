"""Training keeps what it trained: a step's rollouts as records, from the rows verl's v1 worker stores.

The rollouts are run by ``StrandsAgentLoop`` and stored by verl's own v1 worker (``fixtures.recorded_step``);
the records are built as the guarded trainer builds them after the advantages (no Ray, no verl trainer: the
end-to-end check belongs in a real verl run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.recorded_step import stored_rows, with_advantages, write_step
from fixtures.verl_loop import lookup_call, team_script, turns_script

from rllm.errors import ConfigurationError
from rllm.records import CONVERSATION_FIELD, ROLLOUTS_DIR, step_file_name
from rllm.training.verl.settings import RolloutRecordSettings, read_settings
from rllm.training.verl.trainer.rollout_records import build_records

RIGHT = turns_script(lookup_call("France"), "The capital is \\boxed{Paris}.")
WRONG = turns_script(lookup_call("France"), "The capital is \\boxed{Lyon}.")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


async def test_a_steps_records_hold_task_conversation_reward_advantage_and_trained_tokens(tokenizer, tmp_path) -> None:
    keys, columns = await stored_rows(tokenizer, [({"session_id": 0}, RIGHT), ({"session_id": 1}, WRONG)])

    path = write_step(tmp_path, 7, tokenizer, keys, columns)

    assert path == tmp_path / ROLLOUTS_DIR / "step_000007.jsonl" and step_file_name(7) == path.name
    right, wrong = _lines(path)
    assert [r["rollout"] for r in (right, wrong)] == ["u-0_0", "u-0_1"] and right["group"] == wrong["group"] == "u-0"
    assert right["task_text"] == "Which city is the capital of France?" and right["step"] == 7
    assert (right["reward"], wrong["reward"]) == (1.0, 0.0) and (right["advantage"], wrong["advantage"]) == (1.0, -1.0)
    assert right["termination_reason"] == "finished" and right["final_answer"] == "The capital is \\boxed{Paris}."
    kinds = [(e["kind"], e.get("message", {}).get("role")) for e in right["trajectories"][0]["conversation"]]
    assert kinds == [("message", "system"), ("message", "user"), ("output", None), ("message", "tool"),
                     ("output", None)]
    # The parser's random call id numbered in order: the same rollout records alike, each result with its call.
    assert right["trajectories"][0]["conversation"][3]["message"]["tool_call_id"] == "call_1"
    call = right["trajectories"][0]["conversation"][2]["tool_calls"][0]
    assert call == {"name": "lookup", "arguments": '{"key": "France"}'}
    (sample,) = right["samples"]
    # Exactly the stored row: its ids, verl's response mask, the sampled log-probs; pieces decode to the ids' text.
    row = columns["responses"][0].tolist()
    assert sample["response_ids"] == row and sample["loss_mask"] == columns["response_mask"][0].tolist()
    assert sample["prompt_ids"] == columns["prompts"][0].tolist() and len(sample["logprobs"]) == len(row)
    assert "".join(sample["response_tokens"]) == tokenizer.decode(row)
    assert 0 < sum(sample["loss_mask"]) < len(row)  # the tool result is in the response, not trained
    trained = "".join(t for t, m in zip(sample["response_tokens"], sample["loss_mask"], strict=True) if m)
    assert "\\boxed{Paris}" in trained and "The entry for France" not in trained
    assert sample["advantage"] == 1.0


async def test_a_teams_nodes_and_a_split_rollouts_samples_are_each_kept(tokenizer, tmp_path) -> None:
    keys, columns = await stored_rows(tokenizer, [({"session_id": 0}, team_script), ({"session_id": 1}, team_script)],
                                      stand_in_tool=False, tool_factory=None,
                                      agent_factory="fixtures.verl_loop:research_team")

    first, _ = _lines(write_step(tmp_path, 1, tokenizer, keys, columns))

    assert [s["agent"] for s in first["samples"]] == ["researcher", "writer"]
    assert [s["index"] for s in first["samples"]] == [0, 1]
    assert [t["name"] for t in first["trajectories"]] == ["researcher", "writer"]
    names = [c["name"] for e in first["trajectories"][0]["conversation"] if e["kind"] == "output"
             for c in e["tool_calls"]]
    assert names == ["lookup", "handoff_to_agent"]


async def test_max_per_step_keeps_the_first_rollouts(tokenizer) -> None:
    keys, columns = await stored_rows(tokenizer, [({"session_id": 0}, RIGHT), ({"session_id": 1}, WRONG)])

    records = build_records(2, keys, with_advantages(keys, columns), max_rollouts=1)

    assert [r["rollout"] for r in records] == ["u-0_0"] and "response_tokens" not in records[0]["samples"][0]


async def test_with_records_off_the_loop_sends_no_conversation(tokenizer) -> None:
    _, on = await stored_rows(tokenizer, [({"session_id": 0}, RIGHT)])
    _, off = await stored_rows(tokenizer, [({"session_id": 0}, RIGHT)], "rllm.rollout_records.every_n_steps=null")

    assert json.loads(on["extra_fields"][0][CONVERSATION_FIELD])["trajectories"]
    assert off["extra_fields"][0][CONVERSATION_FIELD] == ""


def test_the_knob_is_read_from_the_recipe_and_refused_naming_the_key() -> None:
    settings = read_settings({"rllm": {"rollout_records": {"every_n_steps": 5, "max_per_step": 64}}}).rollout_records
    assert settings == RolloutRecordSettings(every_n_steps=5, max_per_step=64)
    assert [step for step in range(1, 12) if settings.keeps(step)] == [5, 10]
    assert not RolloutRecordSettings(every_n_steps=None).keeps(5) and RolloutRecordSettings().keeps(1)
    with pytest.raises(ConfigurationError, match=r"rllm\.rollout_records\.every_n_steps=0: expected a whole number"):
        read_settings({"rllm": {"rollout_records": {"every_n_steps": 0}}})
    with pytest.raises(ConfigurationError, match=r"rllm\.rollout_records\.max_per_step='all'"):
        read_settings({"rllm": {"rollout_records": {"max_per_step": "all"}}})
