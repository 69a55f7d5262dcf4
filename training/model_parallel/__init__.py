"""Model parallelism: tensor-parallel layers (:mod:`.layers`), pipeline stages (:mod:`.pipeline`),
the data x tensor x pipeline rank grid (:mod:`.grid`), its training driver (:mod:`.grid_train`,
``--tensor-parallel`` / ``--pipeline-parallel`` / ``--micro-batches``), its report (:mod:`.report`) and sharded checkpoints (:mod:`.sharded`).

Imports: the shared trainer modules of :mod:`training`, :mod:`training.dp` and :mod:`collectives`.
"""
