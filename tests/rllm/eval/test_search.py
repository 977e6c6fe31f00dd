"""``rllm.eval.search``'s command line as a user reads it (the runs themselves: ``tests/rllm/agents/test_search.py``)."""

from __future__ import annotations

import pytest

from rllm.eval import search


def test_help_shows_the_example_commands_as_they_are_typed(capsys: pytest.CaptureFixture[str]) -> None:
    # A two-line shell command keeps its backslash and line break, so it can be pasted as shown.
    with pytest.raises(SystemExit) as exited:
        search.main(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert (
        "    python examples/strands/search_agent_strands.py --base-url http://127.0.0.1:30000/v1 \\\n"
        "        --model Qwen/Qwen3-4B --rollouts 4\n"
    ) in shown
