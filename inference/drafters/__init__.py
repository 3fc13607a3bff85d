"""The drafter modules the decode loop runs beside the target, one module per method: Medusa's heads, EAGLE-1's
and EAGLE-3's heads, BiTA's prompt and mask embeddings. The trainers train them; their proposers
(:mod:`draftsmith.inference.proposers`) draft with them; their artefact loaders and exporters live in
:mod:`draftsmith.inference.artefacts`."""
