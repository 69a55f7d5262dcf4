"""Model replicas: the trained checkpoint as a prediction function, and the ranks that serve it.

- :mod:`inference.replicas.predictor`: a checkpoint as a prediction function whose answer for a row
  does not depend on its batch;
- :mod:`inference.replicas.tensor`: a tensor-parallel replica (the MLP re-sharded into column- and
  row-parallel Linear layers) and its single-process reference;
- :mod:`inference.replicas.replica`: the wire format between the front and the replicas, and the
  replica loop.

May import ``training`` (checkpoints, layers), ``collectives`` and ``commlab``; nothing else of
:mod:`inference` (the front imports the wire format from here).
"""
