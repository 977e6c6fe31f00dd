"""The quickstart and the learning proofs: train a Strands tool agent, then evaluate it, end to end.

``quickstart`` (``bash scripts/quickstart.sh``) trains through verl's own trainer and evaluates the trained
policy; ``verl_trainer`` and ``local_trainer`` are the learning proof through verl's trainer and through the
local RLOO trainer. This room sits above training and evaluation: it uses both, neither uses it.
"""
