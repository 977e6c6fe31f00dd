"""Retrieval service for the search agent (FastAPI + FAISS); filled in by the retrieval issue."""
