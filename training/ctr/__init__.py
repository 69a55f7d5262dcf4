"""The ctr model (``--model ctr``): embedding tables and an MLP on click data, trained three ways.

:mod:`.data` generates the synthetic click data with a planted truth and checks a configuration's memory,
:mod:`.model` is the model (pooled embeddings into an MLP, logistic loss), :mod:`.sparse_optim` the
sparse SGD and Adagrad the servers run on the rows a batch touches, :mod:`.modes` the ``dp``, ``ps`` and
``hybrid`` training loops, :mod:`.run` the job (roles, records), :mod:`.resume` the ranks' checkpoints,
:mod:`.hotkeys` the per-server load.

Imports: :mod:`training.ps_mode`, :mod:`training.dp`, :mod:`training.model` (the trainer's shared modules), :mod:`ps` and
:mod:`collectives`.
"""
