"""Draft & Verify (Zhang et al. 2023): search with Optuna for the attention and MLP sublayers the target skips while
drafting for itself, then write a weightless artefact with the best skip set and the adaptive threshold rule.

    python recipes/draft_verify.py                                   # the tiny zoo target, 40 trials
    python recipes/draft_verify.py --target smollm2-135m --n-trials 60 --timeout 3600 --threads 1 \\
        --output_dir runs/draft_verify_smollm2 --evaluate
    optuna-dashboard sqlite:///runs/draft_verify_tiny/study.db              # the study, as it is
    draftsmith eval --artefact runs/draft_verify_tiny/artefact

A killed search rerun with the same --output_dir continues its study (finished trials are kept). The logic lives
in draftsmith.inference.evaluation.draft_verify and draftsmith.launch.draft_verify. Paper, defaults and every departure
from them: docs/METHODS.md#draft--verify.
"""

import sys

from draftsmith.launch.draft_verify import main

if __name__ == "__main__":
    sys.exit(main())
