"""The decode core: the model adapter, the KV cache, sampling, drafts and their verification, token trees, the
proposer seam and the speculative decode loop itself. It imports nothing else of :mod:`draftsmith.inference`."""
