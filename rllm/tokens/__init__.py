"""Token-level records and rendering for token-in/token-out rollouts."""
