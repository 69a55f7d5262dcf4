"""Interop: adapters that let PyTorch (DDP communication hook, distributed optimizer) and JAX
call commlab's collectives. PyTorch is imported inside the functions that need it.

Imports: :mod:`collectives.calls`, :mod:`collectives.compression` and below.
"""
