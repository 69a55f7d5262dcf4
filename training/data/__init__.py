"""Data, and which part of it each rank reads.

:mod:`.datasets` loads the data sets (embedded digits, MNIST IDX files, synthetic) alike on every
rank, :mod:`.sampling` gives each rank its share of every epoch and of the evaluation set,
:mod:`.partition` draws skewed (non-IID) partitions of a training set over the workers,
:mod:`.shard_sampler` gives each worker its batches from its own shard, and :mod:`.skew` sets up a
run's skewed data from its configuration (the partition, each worker's sampler, the record).

Imports: :mod:`ps` (the batch-splitting rule), :mod:`collectives` (logging) and the floor below
them; nothing else of :mod:`training`.
"""
