"""DistillSpec: a draft model distilled into its target — config, trainer and the method's spec."""
