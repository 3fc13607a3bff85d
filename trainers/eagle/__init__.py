"""EAGLE-1, EAGLE-3 (EAGLE-3.1's options) and P-EAGLE: feature-level draft heads — config, the training-time test
(ttt), its loss, trainer, and the specs of ``eagle`` and ``peagle``."""
