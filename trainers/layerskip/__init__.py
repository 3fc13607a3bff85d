"""LayerSkip: layer dropout and early-exit losses so the target drafts with its first layers — config,
trainer, spec."""
