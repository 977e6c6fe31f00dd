"""The served-weights check: the weights the rollout server samples from are the ones the actor just trained.

``served_weights`` compares fingerprints (``fingerprint``) of the actor's parameters and the engine's
(``engine_weights``) after every sync, and stops the run when they differ or stop changing.
"""
