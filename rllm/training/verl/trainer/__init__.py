"""verl's trainer, guarded: the task runner that registers it, the guards, the RLOO advantage and the step batch.

The recipes name ``rllm.training.verl.trainer.runner`` (the task runner) and the guard settings; the rest is
what the runner's trainer calls each step.
"""
