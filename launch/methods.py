"""The composition root: every built-in method's spec, in the order the command line lists them. A method declares
itself in its own package (``SPEC``); adding one is its own files plus one line here."""

from __future__ import annotations

from draftsmith.inference.methods import ar, draft_model, draft_verify, early_exit, jacobi, prompt_lookup
from draftsmith.trainers.bita import spec as bita
from draftsmith.trainers.cllm import spec as cllm
from draftsmith.trainers.dflash import spec as dflash
from draftsmith.trainers.distillspec import spec as distillspec
from draftsmith.trainers.dspark import spec as dspark
from draftsmith.trainers.eagle import spec as eagle
from draftsmith.trainers.layerskip import spec as layerskip
from draftsmith.trainers.medusa import spec as medusa

SPECS = (
    ar.SPEC,
    draft_model.SPEC,
    prompt_lookup.SPEC,
    early_exit.SPEC,
    layerskip.SPEC,
    draft_verify.SPEC,
    distillspec.SPEC,
    medusa.SPEC,
    eagle.SPEC,
    eagle.PEAGLE,
    dflash.SPEC,
    dspark.SPEC,
    bita.SPEC,
    jacobi.SPEC,
    cllm.SPEC,
)
