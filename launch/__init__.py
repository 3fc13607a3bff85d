"""The draftsmith command line (`draftsmith train|eval|export|data|zoo|...`), the recipe runner, and the accelerate
and DeepSpeed configs (data files, not code)."""
