"""The training job as a library: warm start, critic warm-up, RL, evaluation, checkpoints."""
