"""Draft & Verify (Zhang et al. 2023): search with Optuna for the attention and MLP sublayers the target skips while
drafting for itself, then write a weightless artefact with the best skip set and the adaptive threshold rule.

    python recipes/layer_skip_search.py                                   # the tiny zoo target, 40 trials
    python recipes/layer_skip_search.py --target smollm2-135m --n-trials 60 --timeout 3600 --threads 1 \\
        --output_dir runs/layer_skip_smollm2 --evaluate
    optuna-dashboard sqlite:///runs/layer_skip_tiny/study.db              # the study, as it is
    draftsmith eval --artefact runs/layer_skip_tiny/artefact

A killed search rerun with the same --output_dir continues its study (finished trials are kept). The logic lives
in draftsmith.inference.layer_search and draftsmith.launch.layer_search.
"""

import sys

from draftsmith.launch.layer_search import main

if __name__ == "__main__":
    sys.exit(main())
