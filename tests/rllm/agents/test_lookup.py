"""The two-hop lookup world the learning proof and the quickstart train on."""

from __future__ import annotations

import pytest

from rllm.agents.lookup import LookupWorld


def test_the_held_out_boxes_are_drawn_from_the_whole_range_the_same_way_every_time() -> None:
    world = LookupWorld(1000, seed=0)
    train, held_out = world.split(48)

    boxes = [t.box for t in held_out]
    assert len(boxes) == 48 and boxes == sorted(boxes)
    assert {t.box for t in train}.isdisjoint(boxes) and len(train) + len(held_out) == 1000
    # Not a block at the end: a block's numbers share digit patterns no training question has.
    assert min(boxes) < 250 and max(boxes) > 750
    assert [t.box for t in LookupWorld(1000, seed=0).split(48)[1]] == boxes  # the rows and the evaluation agree
    assert [t.box for t in LookupWorld(1000, seed=1).split(48)[1]] != boxes


def test_two_lookups_answer_a_question_and_a_held_out_size_outside_the_world_is_refused() -> None:
    world = LookupWorld(60, seed=0)
    task = world.tasks[7]
    assert world.lookup(f"Box  {task.box} ") == f"item {task.item}"
    assert world.lookup(f"item {task.item}") == f"code {task.code}"
    assert world.lookup("box 61").startswith("nothing is stored under")
    with pytest.raises(ValueError, match="held_out must be between 1 and 59"):
        world.split(60)
