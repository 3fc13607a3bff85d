"""The inference module: it loads what the trainers wrote and runs, checks and measures the speculative decode loop.

Rooms, each importing only the ones below it (``lint-imports``)::

    methods       proposer builders, ProposerContext, load_artefact (the registry's seam)
    evaluation    evaluator, runs, metrics, report, baselines, cost model, tuners   | artefacts   manifest, loaders, exports
    proposers     one proposer per method
    drafters      the modules the loop runs beside the target (Medusa, EAGLE, BiTA)
    core          adapter, KV cache, sampling, verification, trees, the decode loop
"""
