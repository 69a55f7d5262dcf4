"""Data-parallel training: the gradient hooks (flat gradient -> optional compressor -> all-reduce,
:mod:`.hooks`), the step and evaluation (:mod:`.data_parallel`), the bucketed step that overlaps
all-reduces with the backward pass (:mod:`.overlap`), local and post-local SGD and the
sample-weighted average (:mod:`.local_sgd`), and each rank's share of every global batch, equal or
following the ranks' measured speeds with ``--balance`` (:mod:`.shares`); the check that every rank
holds the same parameter layout before the first exchange (:mod:`.layout`).

Imports: :mod:`training.runtime`, :mod:`training.data`, :mod:`training.model`
and :mod:`collectives`; :mod:`ps.shards.key_ranges` (the batch-splitting rule). Never :mod:`training.model_parallel` or :mod:`training.ps_mode`.
"""
