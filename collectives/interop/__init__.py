"""Interop: the PyTorch adapters (DDP communication hook, distributed optimizer) over commlab's
collectives. PyTorch is imported inside the functions that need it. JAX and PyTorch arrays enter
every collective directly through DLPack (:func:`collectives.engine.buffers.adopt`); the JAX example
is ``experiments/jax_example.py``.

Imports: :mod:`collectives.calls`, :mod:`collectives.compression` and below.
"""
