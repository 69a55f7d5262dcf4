"""Gradient compression: compressors, error-feedback memory, compressed collectives and the training
hook (``make_hook``)."""
from .base import TRANSPORTS, Compressor, ErrorFeedback, Memory, payload_nbytes
from .comm import allgather_payloads, compressed_allreduce, sparse_allreduce
from .dgc import DGC, DGCMemory
from .hook import CompressionHook, make_hook
from .powersgd import PowerSGD, matrix_layout
from .qsgd import QSGD
from .quantize import FP16Compressor, Int8Compressor, NoneCompressor
from .registry import (COMPRESSORS, compressor_arguments, make_compressor, parse_compression_arg,
                       parse_compression_args, parse_literal, split_key_value)
from .sign import EFSignSGD, OneBit, SignSGD
from .sparse import RandomK, Threshold, TopK
from .terngrad import TernGrad

__all__ = [
    "Compressor", "Memory", "ErrorFeedback", "payload_nbytes",
    "NoneCompressor", "FP16Compressor", "Int8Compressor", "QSGD", "TernGrad",
    "SignSGD", "EFSignSGD", "OneBit", "TopK", "RandomK", "Threshold", "DGC", "DGCMemory",
    "PowerSGD", "matrix_layout",
    "COMPRESSORS", "make_compressor", "compressor_arguments", "parse_compression_args",
    "parse_compression_arg", "parse_literal", "split_key_value", "TRANSPORTS",
    "compressed_allreduce", "sparse_allreduce", "allgather_payloads",
    "CompressionHook", "make_hook",
]
