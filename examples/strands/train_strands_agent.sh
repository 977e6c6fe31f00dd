#!/usr/bin/env bash
# Train the Strands HotpotQA search agent with verl: RLOO, Qwen3-4B, 8 GPUs, fp16.
#
#   bash examples/strands/train_strands_agent.sh [--dry-run] [--smoke] [--cpu] [hydra overrides ...]
#   bash examples/strands/train_strands_agent.sh --help
#
# --smoke runs two real steps of the recipe on this machine (one GPU with the embedded rollout
# backend, or the CPU with --cpu) before a cluster is rented; every step prints the training guards.
#
# Checks that the retrieval server answers at $RETRIEVAL_SERVER_URL (start it with
# `bash rag/launch_rag.sh`) and accepts $RETRIEVAL_TOKEN on an authenticated POST /retrieve, then
# runs examples/strands/train_strands_agent.py with the overrides passed through. --dry-run and --help only compose, validate and print the config:
# no GPU, no Ray, no retrieval server.
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
  -h, --help  this text, then the resolved config (as --dry-run)

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
  exec "$PYTHON" "$ROOT/examples/strands/train_strands_agent.py" --dry-run ${args[@]+"${args[@]}"}
fi
if [[ $dry_run -eq 1 ]]; then
  exec "$PYTHON" "$ROOT/examples/strands/train_strands_agent.py" --dry-run ${args[@]+"${args[@]}"}
fi

"$PYTHON" - "$RETRIEVAL_SERVER_URL" <<'PY'
import asyncio
import os
import sys

import httpx

from rag.client import RetrievalError, check_search

base = sys.argv[1].rstrip("/")
url = base + "/health"
try:
    response = httpx.get(url, timeout=10.0)
    response.raise_for_status()
except httpx.HTTPError as error:
    sys.exit(
        f"retrieval server is not healthy at {url}: {error}\n"
        "start it with `bash rag/launch_rag.sh` (or set RETRIEVAL_SERVER_URL), then run this again"
    )
print(f"retrieval server OK at {url}: {response.text[:200]}")
# /health needs no token: prove the rollout workers' search works, token included.
try:
    hits = asyncio.run(check_search(base, os.environ.get("RETRIEVAL_TOKEN") or None))
except RetrievalError as error:
    sys.exit(f"an authenticated POST {base}/retrieve failed: {error}\n"
             "training would drop or fail every rollout; fix this, then run this again")
print(f"authenticated POST {base}/retrieve OK ({len(hits)} passage)")
PY

exec "$PYTHON" "$ROOT/examples/strands/train_strands_agent.py" ${args[@]+"${args[@]}"}
