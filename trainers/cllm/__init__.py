"""CLLM: consistency training on the target's Jacobi trajectories — config, trainer, spec."""
