"""The data-parallel ranks' model check: every rank must hold the same parameter layout.

Run once before the first gradient exchange, as PyTorch DDP does at construction: ranks whose models
differ would otherwise all-reduce buffers of different lengths (a hang) or average unrelated
parameters (a silently wrong model).
"""
import hashlib
import math

import numpy
from mpi4py import MPI

from collectives.engine.waiting import wait_within

__all__ = ["verify_param_layout"]


def _layout(model):
    """Return the parameter layout of ``model`` as an int64 vector.

    ``[itemsize, kind, n_layers, n_arrays, ndim_0, *shape_0, ndim_1, *shape_1, ...]``.
    """
    shapes = [tuple(p.shape) for p, _ in model.parameters()]
    code = [model.dtype.itemsize, ord(model.dtype.kind), len(model.layers), len(shapes)]
    for s in shapes:
        code += [len(s), *s]
    return numpy.array(code, numpy.int64)


def _describe(code):
    """Return a readable form of a :func:`_layout` vector: layers, shapes, dtype and size."""
    dtype = numpy.dtype(f"{chr(int(code[1]))}{int(code[0])}")
    shapes, i = [], 4
    for _ in range(int(code[3])):
        nd = int(code[i])
        shapes.append(tuple(int(d) for d in code[i + 1:i + 1 + nd]))
        i += 1 + nd
    n = sum(math.prod(s) for s in shapes)
    return f"{int(code[2])} layers, parameter shapes {shapes} ({dtype}, {n} parameters)"


def verify_param_layout(model, comm, timeout=None):
    """Check that every rank holds a model of the same parameter layout; raise on every rank if not.

    Each rank computes a fingerprint of its layout (int64 vector: number of parameters, of layers,
    of parameter arrays, dtype itemsize and kind, a 63-bit BLAKE2 hash of the shapes and dtype,
    and the length of the full layout) and one ``Allgather`` exchanges it, as PyTorch DDP's
    ``_verify_param_shape_across_processes`` does at construction (Li et al., VLDB 2020,
    section 3.1). When the fingerprints differ, one ``Allgatherv`` of the full layouts lets every
    rank raise the same error. Collective over ``comm``: call it on every rank, before the first
    gradient exchange (ranks with different layouts would otherwise all-reduce buffers of
    different lengths: a hang or a silently wrong average).

    Parameters
    ----------
    model : training.model.nn.Sequential
    comm : mpi4py.MPI.Comm
        Communicator of the data-parallel ranks.
    timeout : float, optional
        Seconds each exchange may wait for a peer (None: no limit).

    Raises
    ------
    collectives.CollectiveTimeout
        When a peer does not take part within ``timeout`` (it died or is elsewhere).
    ValueError
        On every rank, when some rank's layout differs from rank 0's: names the first such rank
        and gives both layouts (layers, parameter shapes, dtype, number of parameters).
    """
    code = _layout(model)
    digest = hashlib.blake2b(code.tobytes(), digest_size=8).digest()
    h = int(numpy.frombuffer(digest, numpy.int64)[0]) & ((1 << 63) - 1)
    mine = numpy.array([model.size, len(model.layers), int(code[3]), int(code[0]), int(code[1]), h,
                        code.size], numpy.int64)
    every = numpy.empty((comm.size, mine.size), numpy.int64)  # (P, 7)
    wait_within(comm.Iallgather(mine, every), timeout, "allgather", "model layout check")
    differ = [r for r in range(comm.size) if not numpy.array_equal(every[r], every[0])]
    if not differ:
        return
    counts = every[:, -1].astype(numpy.int64)
    displs = numpy.concatenate(([0], numpy.cumsum(counts)[:-1]))
    codes = numpy.empty(int(counts.sum()), numpy.int64)
    wait_within(comm.Iallgatherv(code, [codes, counts, displs, MPI.INT64_T]), timeout, "allgather",
                "model layout check")
    r = differ[0]
    theirs, base = (codes[displs[k]:displs[k] + counts[k]] for k in (r, 0))
    raise ValueError(f"the model differs across ranks: rank {r} has {_describe(theirs)}, rank 0 has "
                     f"{_describe(base)}; every rank must build the same model (same --hidden, "
                     f"--activation, --dtype and data set)")
