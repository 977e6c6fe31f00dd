"""The lookup world: what its questions ask and what its held-out split holds."""

from __future__ import annotations

import random

import pytest

from rllm.agents.lookup import LookupWorld, demonstration_script, score_lookup_answer


def test_every_question_is_answered_by_two_lookups_and_only_the_code_scores() -> None:
    world = LookupWorld(50, seed=3)
    for task in world.tasks:
        assert world.lookup(f"box {task.box}") == f"item {task.item}"
        assert world.lookup(f"  Item   {task.item} ") == f"code {task.code}"  # case and spacing are forgiven
        assert score_lookup_answer(f"\\boxed{{{task.code}}}", task) == 1.0
        assert score_lookup_answer(f"\\boxed{{{task.item}}}", task) == 0.0
    assert world.lookup("box 12345") == "nothing is stored under 'box 12345'"


def test_the_held_out_boxes_look_like_the_training_boxes() -> None:
    # Boxes numbered 1..1000 held out 953-1000: no training question had a box in the 960s-990s, and the
    # trained policy copied "box 986" as "box 966". Held-out boxes must differ from the training ones
    # only in being unseen: the same length, and prefixes the training questions have.
    train, held_out = LookupWorld(1000, seed=0).split(48)
    assert {len(str(t.box)) for t in train} == {len(str(t.box)) for t in held_out} == {4}
    seen = {str(t.box)[:2] for t in train}
    assert all(str(t.box)[:2] in seen for t in held_out), [t.box for t in held_out if str(t.box)[:2] not in seen]
    assert not {t.box for t in train} & {t.box for t in held_out}
    assert len({t.box for t in train + held_out}) == len({t.item for t in train + held_out}) == 1000


def test_a_world_is_its_seed() -> None:
    assert LookupWorld(30, seed=1).tasks == LookupWorld(30, seed=1).tasks != LookupWorld(30, seed=2).tasks


@pytest.mark.parametrize("size", [0, 9001])
def test_a_world_of_impossible_size_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="1 to 9,000 boxes"):
        LookupWorld(size)


def test_a_two_hop_demonstration_looks_up_the_box_then_its_item() -> None:
    task = LookupWorld(5, seed=0).tasks[2]
    script = demonstration_script(task, "two_hops", random.Random(0))
    first = script([{"role": "user", "content": task.question}])
    second = script([{"role": "user", "content": task.question}, {"role": "tool", "content": f"item {task.item}"}])
    done = script([{"role": "tool", "content": ""}, {"role": "tool", "content": ""}])
    assert first["tool_calls"][0]["function"]["arguments"] == f'{{"key": "box {task.box}"}}'
    assert second["tool_calls"][0]["function"]["arguments"] == f'{{"key": "item {task.item}"}}'
    assert done == {"content": f"\\boxed{{{task.code}}}"}
