"""A new user's agent trains with ``AgentTrainer`` through verl's own trainer on CPU, and a run that learns nothing fails.

``docs/train-your-own-agent.md`` is run as a reader runs it, block after block, in a fresh folder with no
retrieval server: its first block saved as ``my_agents.py`` (a plain Strands agent with one ``@tool``,
tasks with fields of their own, a reward returning ``RewardOutput``), then the tiny model, the evaluation
and ``AgentTrainer(..., cpu=True, smoke=True).train()``, then the evaluation of the trained model beside the
base model, each as its own script. Asserted: the evaluation scored every episode; verl validated before the
first step and after the last, and trained two steps whose reward varied within a group and whose actor
gradient was not zero; the factory and the reward read the user's own fields (a ``KeyError`` would fail the
run); the run left a Hugging Face model (safetensors, tokenizer, chat template) that transformers loads,
whose weights moved from the base model's, a learning curve and TensorBoard event files; the last block
printed the before/after table.
Then the same agent with a reward that is 0 for every answer: the smoke run fails, saying there was no
learning signal (the guard fires on a constant reward injected from the user's side, not from rllm).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

os.environ.setdefault("OTEL_SDK_DISABLED", "true")
pytest.importorskip("verl", reason="AgentTrainer runs verl's trainer (the train extra)")

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs" / "train-your-own-agent.md"
pytestmark = [pytest.mark.timeout(1500), pytest.mark.slow(verl_runs=3)]


def _python_blocks() -> list[str]:
    tokens = MarkdownIt().parse(PAGE.read_text(encoding="utf-8"))
    return [t.content for t in tokens if t.type == "fence" and t.info.strip() == "python"]


def _env(folder: Path) -> dict[str, str]:
    ray_dir = tempfile.mkdtemp(prefix="rllm-ray-")  # short: Ray's socket paths must fit in 107 bytes
    return {**os.environ, "RAY_TMPDIR": ray_dir, "RAY_DEDUP_LOGS": "0", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join([str(folder), str(REPO), os.environ.get("PYTHONPATH", "")])}


def _script(folder: Path, name: str, code: str) -> subprocess.CompletedProcess[str]:
    (folder / name).write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, name], cwd=folder, env=_env(folder), capture_output=True, text=True,
                          timeout=1100)
    (folder / f"{name}.log").write_text(proc.stdout + proc.stderr)
    return proc


@pytest.fixture(scope="module")
def page_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[subprocess.CompletedProcess[str]]]:
    """The page's blocks, in order, in a fresh folder: the module, then each script."""
    folder = tmp_path_factory.mktemp("reader")
    module, *scripts = _python_blocks()
    assert module.startswith("# my_agents.py")
    (folder / "my_agents.py").write_text(module, encoding="utf-8")
    runs = []
    for index, code in enumerate(scripts):
        runs.append(_script(folder, f"block_{index + 2}.py", code))
        assert runs[-1].returncode == 0, runs[-1].stdout[-3000:] + runs[-1].stderr[-3000:]
    return folder, runs


def test_the_pages_blocks_are_a_module_a_model_an_evaluation_and_a_training_run() -> None:
    blocks = _python_blocks()
    assert len(blocks) == 6
    assert "AgentWorkflowEngine" in blocks[2] and "AgentTrainer(" in blocks[3] and "cpu=True" in blocks[3]
    assert "final_model_dir" in blocks[4] and "TransformersEngine" in blocks[4]
    assert '"actor_rollout_ref.model.lora_rank": 8' in blocks[5] and "PeftModel.from_pretrained" in blocks[5]


def test_a_lora_smoke_run_trains_only_the_adapter_serves_it_every_step_and_keeps_it_for_peft(page_run: Any) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, runs = page_run
    run_dir = folder / "runs/mine-lora"
    log = (run_dir / "train.log").read_text()
    counted = re.search(r"the actor trains (\d+) of its (\d+) parameters \([\d.]+%\), all of them LoRA adapter "
                        r"weights \(peft's count\)", log)
    assert counted, log[-3000:]
    trainable, total = int(counted[1]), int(counted[2])
    assert 0 < trainable < total / 10
    metrics = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if m["step"] > 0]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # the served weights (the adapter included) were the actor's after every sync
        assert m["data"]["rllm/weights/fingerprint_match"] == 1.0 and m["data"]["rllm/weights/exact"] == 1.0
        assert m["data"]["rllm/actor/trainable_params"] == trainable
    assert any(m["data"]["actor/grad_norm"] > 0 for m in metrics)
    said = runs[4].stdout
    adapter = run_dir / "global_step_2/actor/lora_adapter"
    assert f"adapter: {adapter}" in said and f"merged model: {run_dir / 'global_step_2/actor/huggingface'}" in said
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["base_model_name_or_path"] == "runs/tiny-qwen3"
    moved = float(said.split("the adapter moves the logits by")[1].split()[0])
    assert moved > 0  # the saved adapter is not the untrained one (lora_B starts at zero)
    prompt = torch.tensor([[13, 2048, 7, 99, 512]])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(folder / "runs/tiny-qwen3")
        adapted = PeftModel.from_pretrained(base, str(adapter))(prompt).logits
        merged = AutoModelForCausalLM.from_pretrained(run_dir / "global_step_2/actor/huggingface")(prompt).logits
    assert torch.allclose(adapted, merged, atol=1e-4)  # the merged model is base plus this adapter


def test_the_evaluation_scores_every_episode_of_the_users_tasks(page_run: Any) -> None:
    folder, runs = page_run
    lines = runs[1].stdout.strip().splitlines()
    assert len(lines) == 4 * 2  # four tasks, two rollouts each
    assert all(line.split()[0] in {"finished", "max_turns", "max_tokens"} for line in lines), lines
    episodes = [json.loads(line) for line in (folder / "runs/mine/episodes.jsonl").read_text().splitlines()]
    assert {e["task"]["country"] for e in episodes} == {"France", "Japan", "Kenya", "Peru"}  # the user's own dicts


def test_agent_trainer_trains_the_users_agent_two_steps_with_a_gradient(page_run: Any) -> None:
    folder, runs = page_run
    lines = [json.loads(line) for line in (folder / "runs/mine/metrics.jsonl").read_text().splitlines()]
    # Validation before the first step (step 0) and with the last; training metrics on steps 1 and 2.
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert [m["step"] for m in lines if "val-core/tasks/reward/mean@1" in m["data"]] == [0, 2]
    # The loop hands verl the score and the numbers beside it; verl logs them for validation and training alike.
    assert {"val-aux/tasks/correct/mean@1", "val-aux/tasks/tool_calls/mean@1"} <= lines[0]["data"].keys()
    assert all("critic/score/mean" in m["data"] for m in lines if m["step"] > 0)
    metrics = [m for m in lines if m["step"] > 0]
    assert [m["step"] for m in metrics] == [1, 2]
    printed = [line.split() for line in runs[2].stdout.strip().splitlines()[-2:]]
    assert [row[0] for row in printed] == ["1", "2"]  # the page prints train()'s metrics, one line a step
    signal = [m["data"]["rllm/guard/groups_with_signal_share"] for m in metrics]
    grads = [m["data"]["actor/grad_norm"] for m in metrics]
    assert any(s > 0 for s in signal), signal  # the reward varied within a group ...
    assert any(g > 0 for g, s in zip(grads, signal, strict=True) if s > 0), grads  # ... and the weights moved
    assert "retrieval server" not in (folder / "runs/mine/train.log").read_text()  # none needed, none checked
    recipe = (folder / "runs/mine/agent_trainer.yaml").read_text()
    assert "agent_factory: my_agents:my_agent" in recipe and "reward_fn: my_agents:my_reward" in recipe


def test_the_run_leaves_a_model_transformers_loads_whose_weights_moved(page_run: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, runs = page_run
    model_dir = folder / "runs/mine/global_step_2/actor/huggingface"
    said = runs[2].stdout
    assert f"model: {model_dir}" in said  # TrainResult.model_path
    assert list(model_dir.glob("*.safetensors")), sorted(p.name for p in model_dir.iterdir())
    template = (folder / "runs/tiny-qwen3/chat_template.jinja").read_text()
    assert (model_dir / "chat_template.jinja").read_text() == template  # the template it was trained with
    assert AutoTokenizer.from_pretrained(model_dir).chat_template
    assert json.loads((model_dir / "config.json").read_text())["dtype"] == "float32"  # as the CPU rollouts sampled
    trained = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    base = AutoModelForCausalLM.from_pretrained(folder / "runs/tiny-qwen3", dtype=torch.float32).state_dict()
    assert trained.keys() == base.keys() and all(value.dtype == torch.float32 for value in trained.values())
    moved = [name for name in base if not torch.equal(trained[name], base[name])]
    assert moved, "the exported weights are the base model's"
    assert "the final policy as a Hugging Face model: " + str(model_dir) in (folder / "runs/mine/train.log").read_text()


def test_the_run_keeps_every_steps_rollouts_and_the_viewer_shows_their_trained_tokens(page_run: Any) -> None:
    import statistics

    from starlette.testclient import TestClient

    from rllm.viewer import create_app, open_source

    folder, _ = page_run
    run = folder / "runs/mine"
    metrics = {m["step"]: m["data"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    for step in (1, 2):
        records = [json.loads(line) for line in (run / f"rollouts/step_{step:06d}.jsonl").read_text().splitlines()]
        assert records and all(r["step"] == step and r["task_text"] and r["trajectories"] and r["samples"]
                               for r in records)
        assert all(len(s["response_ids"]) == len(s["loss_mask"]) == len(s["logprobs"]) == len(s["response_tokens"])
                   and sum(s["loss_mask"]) > 0 for r in records for s in r["samples"])
        assert statistics.fmean(r["reward"] for r in records) == pytest.approx(metrics[step]["critic/score/mean"])
    assert 'class="tok tok-trained"' in TestClient(create_app(open_source(run))).get("/step/2/episode/0").text


def test_the_run_draws_its_curve_reports_validation_and_writes_tensorboard_events(page_run: Any) -> None:
    folder, runs = page_run
    curve = folder / "runs/mine/learning_curve.png"
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and curve.stat().st_size > 10_000
    said = runs[2].stdout.splitlines()
    assert f"learning curve: {curve}" in said
    assert [line.split()[3] for line in said if line.startswith("validation at step")] == ["0", "2"]
    assert list((folder / "runs/mine/tensorboard").glob("events.out.tfevents.*"))  # trainer.logger: tensorboard


def test_the_trained_model_is_evaluated_beside_the_base_model(page_run: Any) -> None:
    _, runs = page_run
    table = [line.split() for line in runs[3].stdout.strip().splitlines()[-3:]]
    assert table[0] == ["model", "episodes", "reward", "correct", "tool", "calls"], runs[3].stdout[-2000:]
    assert [row[0] for row in table[1:]] == ["base", "trained"] and all(row[1] == "16" for row in table[1:])
    assert all(0.0 <= float(row[2]) <= 1.0 for row in table[1:])  # every episode scored (no nan)


def test_resuming_the_finished_run_is_refused_before_ray_saying_it_is_finished(page_run: Any) -> None:
    folder, _ = page_run
    code = (
        "import time\n"
        "from my_agents import TASKS, my_agent, my_reward\n"
        "from rllm.errors import TrainingRunError\n"
        "from rllm.trainer import AgentTrainer\n"
        "from rllm.workflows import StrandsWorkflow\n\n"
        "trainer = AgentTrainer(StrandsWorkflow, {'agent_factory': my_agent, 'reward_fn': my_reward},\n"
        "                       {'actor_rollout_ref.model.path': 'runs/tiny-qwen3', 'data.max_prompt_length': 512,\n"
        "                        'data.max_response_length': 512, 'actor_rollout_ref.rollout.max_model_len': 1024},\n"
        "                       TASKS, cpu=True, smoke=True, output_dir='runs/mine', resume=True)\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    trainer.train()\n"
        "except TrainingRunError as error:\n"
        "    print('REFUSED', round(time.monotonic() - started), error)\n"
    )
    proc = _script(folder, "resume_finished.py", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused = [line.split(maxsplit=2) for line in proc.stdout.splitlines() if line.startswith("REFUSED")]
    assert refused and "finished at step 2 of 2" in refused[0][2], proc.stdout[-3000:]
    assert int(refused[0][1]) < 60  # before Ray: no verl step, no worker started
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    assert (folder / "runs/mine/global_step_2/actor/huggingface").is_dir()  # the finished run is left as it was


def test_a_second_run_in_the_folder_from_two_task_files_trains_anew_and_fails_without_a_learning_signal(
        page_run: Any) -> None:
    # The recipe path on the recipe AgentTrainer wrote into runs/mine, in the same folder as the finished run:
    # a new run (the earlier checkpoints removed, two steps trained again), its tasks from two task files whose
    # rows are numbered across both, and a reward that is 0 for every answer: the run ends "no learning signal".
    folder, _ = page_run
    (folder / "zero_reward.py").write_text("def zero(task, final_answer):\n    return 0.0\n", encoding="utf-8")
    code = (
        "import json\n"
        "from my_agents import TASKS\n"
        "for name, tasks in (('first', TASKS[:2]), ('second', TASKS[2:])):\n"
        "    with open(f'{name}.jsonl', 'w') as out:\n"
        "        out.writelines(json.dumps(task) + '\\n' for task in tasks)\n"
    )
    assert _script(folder, "task_files.py", code).returncode == 0
    command = [sys.executable, "-m", "rllm.training.verl.train", "--cpu", "--smoke", "--config-dir",
               str(folder / "runs/mine"), "--config-name", "agent_trainer", "data.train_files=[first.jsonl,second.jsonl]",
               "rllm.reward_fn=zero_reward:zero", "actor_rollout_ref.model.path=runs/tiny-qwen3",
               "data.max_prompt_length=512", "data.max_response_length=512",
               "actor_rollout_ref.rollout.max_model_len=1024", "rllm.agent_loop.max_tokens_per_turn=64",
               "trainer.resume_mode=disable"]  # the recipe as the refused resume above rewrote it: resume_mode=auto
    proc = subprocess.run(command, cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=1100)
    output = proc.stdout + proc.stderr
    (folder / "second_run.log").write_text(output)
    assert proc.returncode != 0, output[-3000:]
    assert "no learning signal: in all 2 step(s) every rollout of every group got the same reward" in output, \
        output[-3000:]
    assert "step 1: every group's rollouts got the same reward" in output  # the first step's warning
    assert "global_step_2" in next(line for line in output.splitlines() if "removed the earlier run" in line)
    metrics = [json.loads(line) for line in (folder / "runs/mine/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]  # both steps ran again; the end of the run refused them
    import pyarrow.parquet as pq

    indices = [[row["extra_info"]["index"] for row in pq.read_table(path).to_pylist()]
               for path in sorted((folder / "runs/mine/data").glob("train_files_*.parquet"))]
    assert indices == [[0, 1], [2, 3]]  # one row id per task across the two files (verl groups by it)
