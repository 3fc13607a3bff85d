"""Training: the frozen-target trainer every method builds on, the settings and helpers several methods share (mixins),
the losses (the papers' equations beside them), one config dataclass and one Trainer per method, and the model zoo's
pretraining and build."""
