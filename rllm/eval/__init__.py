"""Evaluation: the command-line runs of the search and GAIA agents and their reports (pass@k, per-level tables, charts)."""
