"""Model parallelism: tensor-parallel layers (:mod:`.layers`), pipeline stages (:mod:`.pipeline`),
the data x tensor x pipeline rank grid (:mod:`.grid`), its training driver (:mod:`.grid_train`,
``--tensor-parallel`` / ``--pipeline-parallel`` / ``--micro-batches``), its report (:mod:`.grid_report`) and sharded checkpoints (:mod:`.sharded`).

Imports: :mod:`training.runtime`, :mod:`training.data`, :mod:`training.model`, :mod:`training.monitor`, :mod:`training.dp` and :mod:`collectives`.
"""
