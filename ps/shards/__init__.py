"""Which server holds which part of the parameters: the key-range split of the flat vector
(``key_ranges``: shards, and the proportional split of a batch) and the rows of embedding tables
(``rows``: row sharding, sparse row gradients, row-layout fingerprints).

Pure arithmetic, no messages. Imports: ``collectives.schedules`` (the chunk rule) only; nothing else of
``ps``.
"""
