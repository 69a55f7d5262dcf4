"""Parameter-server training mode (``--mode ps``): :mod:`.worker` runs the job, each rank a worker
(the training loop) or a server (started through :func:`ps.job.runner.run` with the optimizer the
trainer hands it); :mod:`.run_records` writes its records. The protocol itself is :mod:`ps`.

Imports: :mod:`training.runtime`, :mod:`training.data`, :mod:`training.model`, :mod:`training.monitor`, :mod:`training.dp`, :mod:`ps` and
:mod:`collectives`.
"""
