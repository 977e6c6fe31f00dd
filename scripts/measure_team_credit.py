"""Per-episode or per-role RLOO for a Strands team? Both estimators on a two-agent team's real rollouts.

Warm-starts the quickstart's tiny lookup policy on CPU (the local proof's demonstrations and
supervised steps, as the quickstart does), then samples a Strands ``Graph`` of two agents on it:
the lookup agent as ``researcher``, and a ``checker`` that runs only when the researcher's answer
has no boxed code (a conditional edge), so which nodes run depends on what the policy samples. For
``--prompts`` training boxes x ``--n`` rollouts it computes each rollout's advantage both ways
(``rllm.training.verl.trainer.advantage``: ``rollout_advantages``, groups over the prompt's rollouts;
``role_advantages``, groups over the prompt's rollouts in which that node ran) and reports how
often the nodes ran, the per-role group sizes, the groups left without a baseline, and where the
two estimators disagree. ``--out`` gets the numbers as JSON.

    python scripts/measure_team_credit.py --prompts 16 --n 8 --out /tmp/credit.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from strands import Agent
from strands.multiagent import GraphBuilder

from rllm.agents.lookup import LOOKUP_SYSTEM_PROMPT, lookup_reward, lookup_task_rows
from rllm.proofs.local_trainer import LearningProof
from rllm.proofs.quickstart import quickstart_config
from rllm.training.verl.trainer.advantage import role_advantages, rollout_advantages
from rllm.workflows import AgentWorkflowEngine, StrandsWorkflow

CHECKER = "You check the researcher's answer. Reply with the code in \\boxed{}."


def _unboxed(state: Any) -> bool:
    """The checker runs when the researcher's answer has no ``\\boxed{``."""
    result = state.results.get("researcher")
    return result is None or "\\boxed{" not in str(result.result)


def team(proof: LearningProof) -> Any:
    """The factory: researcher (the lookup agent) -> checker, on the rollout's model."""
    def build(model: Any, task: dict[str, Any]) -> Any:
        builder = GraphBuilder()
        builder.add_node(Agent(name="researcher", model=model, tools=proof.tools, system_prompt=LOOKUP_SYSTEM_PROMPT,
                               callback_handler=None), "researcher")
        builder.add_node(Agent(name="checker", model=model, system_prompt=CHECKER, callback_handler=None), "checker")
        builder.add_edge("researcher", "checker", condition=_unboxed)
        builder.set_entry_point("researcher")
        return builder.build()
    return build


def measure(episodes: list[Any]) -> dict[str, Any]:
    """Both estimators over the episodes (one row per node that ran), and how they differ."""
    keys, uids, roles, scores = [], [], [], []
    for number, episode in enumerate(episodes):
        for trajectory in {t.name: t for t in episode.trajectories}.values():
            keys.append(f"{episode.task['id']}-{number}_0")
            uids.append(episode.task["id"])
            roles.append(trajectory.name)
            scores.append(float(episode.reward or 0.0))
    episode_adv = rollout_advantages(keys, uids, scores)
    role_adv = role_advantages(keys, uids, roles, scores)
    group_sizes = Counter((uid, role) for uid, role in zip(uids, roles, strict=True))
    prompts = {uid for uid in uids}
    differ = [abs(a - b) for a, b in zip(episode_adv, role_adv, strict=True)]
    per_role = {role: sorted(size for (_, r), size in group_sizes.items() if r == role) for role in set(roles)}
    return {
        "episodes": len(episodes), "prompts": len(prompts),
        "mean_reward": statistics.fmean(float(e.reward or 0.0) for e in episodes),
        "node_runs": dict(Counter(roles)),
        "per_role_group_sizes": per_role,
        "role_groups_without_baseline": sum(1 for size in group_sizes.values() if size == 1),
        "role_groups": len(group_sizes),
        "rows": len(keys),
        "rows_where_the_estimators_differ": sum(1 for d in differ if d > 1e-6),
        "max_abs_difference": max(differ, default=0.0),
        "mean_abs_advantage": {"episode": statistics.fmean(abs(a) for a in episode_adv),
                               "role": statistics.fmean(abs(a) for a in role_adv)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8, help="rollouts per prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    started = time.perf_counter()
    proof = LearningProof(quickstart_config("cpu", seed=args.seed))
    proof.warm_start(proof.demonstrations())
    warm = time.perf_counter() - started
    tasks = proof.rng.sample(proof.train_tasks, args.prompts)
    c = proof.config
    runner = AgentWorkflowEngine(
        StrandsWorkflow, {"agent_factory": team(proof), "reward_fn": lookup_reward,
                          "model_kwargs": {"params": {"temperature": c.temperature, "max_tokens": c.max_tokens}}},
        proof.engine, n_parallel_tasks=args.prompts * args.n, progress=False)
    episodes = asyncio.run(runner.execute_tasks(lookup_task_rows(tasks), n_rollouts=args.n))
    result = {**measure(episodes), "warm_start_seconds": round(warm, 1),
              "seconds": round(time.perf_counter() - started, 1), "seed": args.seed}
    print(json.dumps(result, indent=2))  # noqa: T201 - the script's report
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
