"""Gradient compression: compressors, error-feedback memory, compressed collectives and the training
hook (``make_hook``).

The compressors and their registry are pure (NumPy/CuPy, no MPI) and are imported here. The parts
that communicate, :mod:`.comm` (compressed all-reduce, sparse all-reduce, payload all-gather) and
:mod:`.hook` (the training hook), load on first use, so importing this package does not start MPI.

Imports: :mod:`collectives.calls`, :mod:`collectives.engine` and below (the communicating parts);
the compressors import only :mod:`collectives.backend`.
"""
import importlib

from .base import TRANSPORTS, Compressor, ErrorFeedback, Memory, payload_nbytes
from .dgc import DGC, DGCMemory
from .powersgd import PowerSGD, matrix_layout
from .qsgd import QSGD
from .quantize import BF16Compressor, FP16Compressor, Int8Compressor, NoneCompressor
from .catalog import (COMPRESSORS, compressor_arguments, make_compressor, parse_compression_arg,
                       parse_compression_args, parse_literal, split_key_value)
from .sign import EFSignSGD, OneBit, SignSGD
from .sparse import RandomK, Threshold, TopK
from .terngrad import TernGrad

__all__ = [
    "Compressor", "Memory", "ErrorFeedback", "payload_nbytes",
    "NoneCompressor", "FP16Compressor", "BF16Compressor", "Int8Compressor", "QSGD", "TernGrad",
    "SignSGD", "EFSignSGD", "OneBit", "TopK", "RandomK", "Threshold", "DGC", "DGCMemory",
    "PowerSGD", "matrix_layout",
    "COMPRESSORS", "make_compressor", "compressor_arguments", "parse_compression_args",
    "parse_compression_arg", "parse_literal", "split_key_value", "TRANSPORTS",
]
# The communicating names below load on first use and are not in __all__, so that ``import *``
# does not start MPI: compressed_allreduce, sparse_allreduce, allgather_payloads, CompressionHook,
# make_hook.

_LAZY = {"compressed_allreduce": ".comm", "sparse_allreduce": ".comm", "allgather_payloads": ".comm",
         "CompressionHook": ".hook", "make_hook": ".hook"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'collectives.compression' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
