"""Engines that run models (rollout) and, in later modules, many agents at once."""
