"""Methods at decoding time: what every proposer builder takes (:mod:`.context`), and per method its builder, its
decoding options and its serving-engine counterpart (one module each). The training-free methods' specs live here too;
a trained method's spec (``draftsmith.trainers.<name>.spec``) imports its pieces from here."""

from draftsmith.inference.methods.context import ProposerContext, draft_length, load_artefact

__all__ = ["ProposerContext", "draft_length", "load_artefact"]
