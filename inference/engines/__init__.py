"""Serving engines as a second backend: the engine's own environment (:mod:`.environment`), the runner its
interpreter executes (:mod:`.vllm_runner`, JSON in, JSON out), how each method runs there (:mod:`.vllm`, named by
the registry's ``engine_configs``) and the engine report with its acceptance parity against draftsmith's loop
(:mod:`.report`). It sits beside evaluation and the artefacts' exports, never inside the decode core."""
