#!/usr/bin/env bash
# Start the retrieval server.
#
#   bash rag/launch_rag.sh [data_dir] [port] [extra rag.server args...]
#
# data_dir: an index directory (manifest.json + index + corpus), e.g. one written by
#   `python -m rag.build_index` or scripts/download_search_data.py. Omitted (or "" / "default"):
#   build once, then serve, the embedded default: all-MiniLM-L6-v2 over the HotpotQA paragraphs
#   shipped with rllm, cached in $RAG_CACHE_DIR (default <repo>/.cache/rag/hotpotqa-minilm).
#   Works offline once the `rag` extra is installed.
# port: default 8000.
# Environment: RAG_HOST (bind address, default 127.0.0.1), RETRIEVAL_TOKEN (bearer token, default
#   none; the same variable the local_search tool and the training recipe read; RAG_TOKEN is a
#   deprecated alias), PYTHON (interpreter, default python, else python3).
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
    echo "Extra rag.server args: python -m rag.server --help"
    exit 0
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${1:-}"
port="${2:-8000}"
shift $(( $# < 2 ? $# : 2 ))

python="${PYTHON:-$(command -v python || command -v python3)}"
export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"

if [[ -z "${data_dir}" || "${data_dir}" == "default" ]]; then
    data_dir="${RAG_CACHE_DIR:-${repo}/.cache/rag/hotpotqa-minilm}"
    if [[ ! -f "${data_dir}/manifest.json" ]]; then
        echo "launch_rag: building the default HotpotQA index in ${data_dir} (once)" >&2
        "${python}" -m rag.build_index --demo --out "${data_dir}"
    fi
elif [[ ! -f "${data_dir}/manifest.json" ]]; then
    echo "launch_rag: ${data_dir} has no manifest.json; build one with 'python -m rag.build_index' or" \
         "'python scripts/download_search_data.py', or omit the directory to serve the HotpotQA demo" >&2
    exit 2
fi

exec "${python}" -m rag.server --index-dir "${data_dir}" --host "${RAG_HOST:-127.0.0.1}" --port "${port}" "$@"
