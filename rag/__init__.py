"""Retrieval service for the search agent: auto-batching FastAPI server over a FAISS index.

Importing ``rag`` (or ``rag.client``) stays light: only the server side (``rag.server``,
``rag.build_index``, ``rag.index``, ``rag.encoder``) needs the ``rag`` extra (faiss, numpy,
transformers).

    bash rag/launch_rag.sh                                  # demo index over HotpotQA, port 8000
    python -m rag.build_index --corpus corpus.jsonl --encoder intfloat/e5-base-v2 --out DIR
    python -m rag.server --index-dir DIR --port 8000
"""
