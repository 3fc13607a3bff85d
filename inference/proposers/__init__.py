"""One proposer per drafting method (the seam: :mod:`draftsmith.inference.core.proposer`): a separate draft model,
Medusa and EAGLE heads, BiTA's mask tokens, Jacobi decoding, prompt lookup, and self-speculation (LayerSkip's early
exit, Draft & Verify's skipped sublayers)."""
