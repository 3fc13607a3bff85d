"""The data layer: the shipped corpus and evaluation prompts, chat formatting, datasets and collation, training data the
target writes (self-distillation, synthetic prompts, Jacobi trajectories, and the resumable row files they share),
draft vocabularies, the hidden-state feature cache, the model zoo's specs and reading a built zoo, real targets from
the package registry, and tiny random models for tests."""
