"""Evaluation: the questions, the decode runs and their journal, transformers' baselines, the metrics, the report,
the distribution check, the measured cost model, and the tuners that choose decoding settings from measurements
(draft length and confidence stop, LayerSkip's exit layer, Draft & Verify's skip-set search)."""
