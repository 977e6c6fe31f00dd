#!/usr/bin/env bash
# Train the Strands HotpotQA search agent with verl: RLOO, Qwen3-4B, 8 GPUs, fp16.
#
#   bash examples/strands/train_strands_agent.sh [--dry-run] [--smoke] [--cpu] [hydra overrides ...]
#   bash examples/strands/train_strands_agent.sh --help
#
# --smoke runs two real steps of the recipe on this machine (one GPU with the embedded rollout
# backend, or the CPU with --cpu) before a cluster is rented; every step prints the training guards.
#
# Runs examples/strands/train_strands_agent.py (python -m rllm.training.verl.train) with the overrides
# passed through. Before Ray starts, the launcher tries the agent, its tools and its reward on the first
# training row and, when the agent's tools search (local_search), checks that the retrieval server at
# $RETRIEVAL_SERVER_URL (start it with `bash rag/launch_rag.sh`) accepts $RETRIEVAL_TOKEN on an
# authenticated search. --dry-run does all the checks but the retrieval server's and prints the config;
# --help prints the config as composed: no GPU, no Ray, no retrieval server.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python}"
export RETRIEVAL_SERVER_URL="${RETRIEVAL_SERVER_URL:-http://127.0.0.1:8000}"
export HOTPOTQA_DIR="${HOTPOTQA_DIR:-$ROOT/data/hotpotqa}"
# Ray workers import rllm (the agent loop, the reward); an editable install also does this.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OTEL_SDK_DISABLED="${OTEL_SDK_DISABLED:-true}"

usage() {
  local token_state="unset"
  [[ -n "${RETRIEVAL_TOKEN:-}" ]] && token_state="set"
  cat <<EOF
Usage: bash examples/strands/train_strands_agent.sh [--dry-run] [--smoke] [--cpu] [hydra overrides ...]

Trains the Strands search agent on HotpotQA with verl (recipe:
rllm/training/verl/config/strands_hotpotqa_rloo.yaml). Overrides use Hydra syntax, e.g.
  actor_rollout_ref.model.path=/models/Qwen3-4B trainer.logger=[console,file,wandb]
  rllm.agent_loop.timeout_s=900 actor_rollout_ref.rollout.multi_turn.max_assistant_turns=6

Environment:
  RETRIEVAL_SERVER_URL  retrieval server (now: $RETRIEVAL_SERVER_URL); start: bash rag/launch_rag.sh;
                        written into the recipe (rllm.agent_loop.tool_kwargs.retrieval_url)
  RETRIEVAL_TOKEN       the server's bearer token (now: $token_state); the same
                        variable rag/launch_rag.sh reads; passed to the rollout workers
                        through a Ray actor, never printed with the config or logged
  HOTPOTQA_DIR          train/validation parquet (now: $HOTPOTQA_DIR); make: python scripts/prepare_hotpotqa.py
  PYTHON                interpreter (now: $PYTHON)

Options:
  --dry-run   compose and validate the config, print it resolved, start nothing
  --smoke     two real steps of the recipe on this machine: 2 prompts x 2 rollouts, the embedded
              rollout backend (torch + transformers) on one GPU, guards printed every step
  --cpu       run verl on the CPU (tests, laptops): fp32, FSDP2, gloo; never chosen by itself
  -h, --help  this text, then the resolved config (as composed: nothing checked)

Resolved config:
EOF
}

dry_run=0
help=0
args=()
for arg in "$@"; do
  case "$arg" in
    -h|--help) help=1 ;;
    --dry-run) dry_run=1 ;;
    *) args+=("$arg") ;;
  esac
done

if [[ $help -eq 1 ]]; then
  usage
  exec "$PYTHON" "$ROOT/examples/strands/train_strands_agent.py" --print-config ${args[@]+"${args[@]}"}
fi
if [[ $dry_run -eq 1 ]]; then
  exec "$PYTHON" "$ROOT/examples/strands/train_strands_agent.py" --dry-run ${args[@]+"${args[@]}"}
fi

exec "$PYTHON" "$ROOT/examples/strands/train_strands_agent.py" ${args[@]+"${args[@]}"}
