"""Evaluation: the command-line runs of the search and GAIA agents and their reports.

The reports give pass@k, per-level tables and charts.
"""
