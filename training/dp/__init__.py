"""Data-parallel training: the gradient hooks (flat gradient -> optional compressor -> all-reduce,
:mod:`.hooks`), the step and evaluation (:mod:`.data_parallel`), the bucketed step that overlaps
all-reduces with the backward pass (:mod:`.overlap`), local and post-local SGD and the
sample-weighted average (:mod:`.local_sgd`).

Imports: the shared trainer modules of :mod:`training` (``nn``, ``optim``, ``data``, ``checkpoint``...)
and :mod:`collectives`. Never :mod:`training.model_parallel` or :mod:`training.ps_mode`.
"""
