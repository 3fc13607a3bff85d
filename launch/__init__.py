"""The draftsmith command line, the recipe runner and the method registry; accelerate and DeepSpeed configs."""
