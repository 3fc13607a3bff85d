"""BiTA: prompt and mask tokens tuned on the frozen target — config, trainer, spec."""
