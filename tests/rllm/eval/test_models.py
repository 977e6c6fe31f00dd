"""The model options the evaluations share (``rllm.eval.models``): the endpoint's key, from the environment.

The endpoint is a real OpenAI-compatible server on 127.0.0.1 that answers 401 without its key and
records the ``Authorization`` header of every request.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable

import pytest
from fixtures.keyed_server import KeyedOpenAIServer
from rich.console import Console

from rllm.eval import gaia, search, search_quickstart
from rllm.eval.models import add_model_arguments, check_model_arguments, choose_model, open_engine
from rllm.offline.scripted_server import ScriptedReply
from rllm.processes import free_port

KEY = "sk-endpoint-secret"
WARNING = ("--api-key on the command line is visible to every user of this machine (ps); set OPENAI_API_KEY in the "
           "environment instead")


@pytest.mark.parametrize("main", [search.main, search_quickstart.main, gaia.main],
                         ids=["search", "search_quickstart", "gaia"])
def test_every_eval_names_the_key_s_variable_in_its_help(main: Callable[[list[str]], int],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--api-key SECRET the endpoint's API key (default: $OPENAI_API_KEY; given here, it shows in `ps`" in text


def test_an_endpoint_model_sends_the_key_from_the_environment_with_every_request(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, max_tokens=16)
    with KeyedOpenAIServer(KEY, "hello") as server, caplog.at_level(logging.WARNING, logger="rllm.secret_options"):
        args = parser.parse_args(["--base-url", server.base_url, "--model", "keyed", "--temperature", "0"])
        check_model_arguments(parser, args)
        choice = choose_model(args, Console())  # the endpoint check, with the key
        with open_engine(args, choice, [ScriptedReply(content="unused")]) as (engine, description):

            async def ask() -> str:
                try:
                    return (await engine.get_model_response([{"role": "user", "content": "hi"}])).text
                finally:
                    await engine.close()

            assert asyncio.run(ask()) == "hello"
    assert (choice.kind, choice.name, description) == ("endpoint", "keyed", f"keyed at {server.base_url}")
    assert server.authorizations == [f"Bearer {KEY}"] * 2
    assert not caplog.records


def test_the_search_eval_warns_once_about_a_key_typed_on_the_command_line(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    dead_retrieval = f"http://127.0.0.1:{free_port()}"
    with KeyedOpenAIServer(KEY) as server, caplog.at_level(logging.WARNING, logger="rllm.secret_options"):
        status = search.main(["--base-url", server.base_url, "--model", "keyed", "--api-key", KEY, "--retrieval-url",
                              dead_retrieval, "--output-dir", str(tmp_path), "--no-progress"])
    assert status == 2 and "retrieval server (--retrieval-url)" in capsys.readouterr().out  # stops there: no server
    assert server.authorizations == [f"Bearer {KEY}"]  # the typed key still works (the endpoint check used it)
    (record,) = caplog.records
    assert record.getMessage() == WARNING and KEY not in caplog.text
