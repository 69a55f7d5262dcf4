"""Argument checks: every rule a public collective checks before any message is sent, in one module.

A collective's arguments are checked on every rank alike, before any message (so a bad call raises
everywhere and never hangs): the op (:func:`op_name`, :func:`check_op`), the dtype
(:func:`check_dtype`), the input (:func:`as_array`, :func:`check_device`), ``out``
(:func:`check_out`, :func:`check_distinct`), the root (:func:`check_root`), the timeout
(:func:`check_timeout`), the communicator (:func:`check_comm`), a named choice (:func:`check_choice`).
:func:`check_allreduce` runs the all-reduce's checks in one call, :func:`check_collective` those of
reduce-scatter, broadcast and reduce.

Imports: :mod:`collectives.schedules` (which algorithms serve which collective, the grid rules),
:mod:`collectives.backend`, :mod:`collectives.errors`; mpi4py only inside :func:`op_name` and
:func:`check_comm`, so importing this module starts no MPI.
"""
import numpy

from collectives.backend import COPY_DTYPES, DTYPES, OPS
from commlab.arrays import get_array_module
from collectives.schedules.registry import AlgorithmTable, check_algorithm
from collectives.schedules.torus import check_dims, check_grid

__all__ = ["op_name", "check_op", "check_dtype", "check_op_dtype", "check_root", "check_choice", "check_timeout",
           "check_comm", "as_array", "check_device", "check_out", "check_distinct", "check_allreduce",
           "check_collective"]

_ALLREDUCE = AlgorithmTable("allreduce")  # the all-reduce's algorithms, live (a registered one is in it at once)


def op_name(op):
    """Return the name of ``op``: a name of :data:`OPS` as it is, ``mpi4py.MPI.SUM/PROD/MIN/MAX`` as its name.

    Parameters
    ----------
    op : str or mpi4py.MPI.Op
        ``"sum"``, ``"prod"``, ``"min"``, ``"max"``, ``"avg"``, or one of the four predefined MPI ops.

    Returns
    -------
    str or object
        The op name; anything else is returned unchanged, for :func:`check_op` to refuse.
    """
    if type(op) is str:
        return op
    from mpi4py import MPI

    if isinstance(op, MPI.Op):
        for name, mpi_op in (("sum", MPI.SUM), ("prod", MPI.PROD), ("min", MPI.MIN), ("max", MPI.MAX)):
            if op == mpi_op:
                return name
    return op


def check_op(op):
    """Raise ``ValueError`` naming ``op`` unless it is one of :data:`OPS` (names; MPI ops go through :func:`op_name`)."""
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"unknown op {op!r}: expected one of {', '.join(OPS)} "
                         "(or mpi4py.MPI.SUM, PROD, MIN, MAX)")


def check_dtype(dtype, what="x", allowed=DTYPES):
    """Raise ``TypeError`` unless ``dtype`` is one of ``allowed`` (default :data:`DTYPES`)."""
    dt = numpy.dtype(dtype)
    if dt not in allowed:
        names = ", ".join(d.name for d in allowed)
        if dt.byteorder not in ("=", "|") and dt.newbyteorder("=") in allowed:
            raise TypeError(f"{what} has dtype {dt.str} in non-native byte order: convert it first "
                            f"(x.astype(x.dtype.newbyteorder('='))); expected one of {names} in native order")
        raise TypeError(f"{what} has unsupported dtype {dt.name}: expected one of {names}")


def check_op_dtype(op, dtype):
    """Check ``op`` and ``dtype`` and their pairing.

    Raises
    ------
    ValueError
        Unknown op.
    TypeError
        Unsupported dtype. Every op is defined on every supported dtype (``avg`` on integers is the
        floor of the mean), so no pair is refused beyond that.
    """
    check_op(op)
    check_dtype(dtype)


def check_root(root, size):
    """Raise ``TypeError`` unless ``root`` is an integer, ``ValueError`` unless it is in ``[0, size)``."""
    if isinstance(root, (bool, numpy.bool_)) or not isinstance(root, (int, numpy.integer)):
        raise TypeError(f"root must be an integer rank, not {type(root).__name__} {root!r}")
    if not 0 <= root < size:
        raise ValueError(f"root={root!r} is out of range for a communicator of size {size}")


def check_choice(algorithm, known, what="algorithm"):
    """Raise ``ValueError`` naming ``algorithm`` unless it is in ``known``."""
    if algorithm not in known:
        raise ValueError(f"unknown {what} {algorithm!r}: expected one of {', '.join(known)}")


def check_timeout(timeout):
    """Return ``timeout`` as float seconds (or None); ``ValueError`` unless it is None or finite and > 0."""
    if timeout is None:
        return None
    if isinstance(timeout, (bool, numpy.bool_)) or not isinstance(timeout, (int, float, numpy.integer, numpy.floating)) \
            or not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout={timeout!r} must be None or a positive number of seconds")
    return float(timeout)


def check_comm(comm):
    """Return ``comm`` (``COMM_WORLD`` for None); ``TypeError`` unless it is an mpi4py intracommunicator."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"comm must be an mpi4py intracommunicator, not {type(comm).__name__}"
                        + (" (COMM_NULL)" if isinstance(comm, MPI.Comm) else ""))
    return comm


def as_array(x, name="x"):
    """Return ``x`` as an array of its own module (NumPy or device).

    Raises
    ------
    TypeError
        ``x`` is not an array, or it exposes ``__cuda_array_interface__`` without being a CuPy array
        (a Numba device array, say): device memory is read through CuPy only.
    """
    if hasattr(x, "__cuda_array_interface__"):
        check_device(x, name)
        return x
    if isinstance(x, numpy.ndarray):  # subclasses such as numpy.matrix reshape differently: drop them
        return x if type(x) is numpy.ndarray else numpy.asarray(x)
    if hasattr(x, "__array__") or isinstance(x, (list, tuple, int, float)):
        return numpy.asarray(x)
    raise TypeError(f"{name} must be an array, not {type(x).__name__}")


def check_device(x, name="x"):
    """Raise ``TypeError`` unless ``x``, which exposes ``__cuda_array_interface__``, is a CuPy array (or of
    a type registered with :func:`commlab.arrays.register_device_module`)."""
    if get_array_module(x) is numpy:
        kind = f"{type(x).__module__}.{type(x).__qualname__}"
        raise TypeError(f"{name} ({kind}) exposes __cuda_array_interface__ but is not a CuPy array: commlab reads "
                        f"device memory through CuPy only; pass cupy.asarray({name}) (no copy) or a tensor that "
                        "speaks DLPack (__dlpack__), which commlab imports through CuPy")


def check_out(out, x, shape=None):
    """Raise ``TypeError``/``ValueError`` unless ``out`` is a writable array of ``x``'s dtype and ``shape``.

    ``shape`` defaults to ``x.shape`` (all-reduce); reduce-scatter and all-gather pass their result's.
    """
    if out is None:
        return
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise TypeError(f"out must be an array, not {type(out).__name__}")
    shape = x.shape if shape is None else tuple(shape)
    if out.shape != shape:
        raise ValueError(f"out has shape {getattr(out, 'shape', None)}, expected {shape}")
    if out.dtype != x.dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {x.dtype}")
    if not getattr(getattr(out, "flags", None), "writeable", False):
        raise ValueError("out is read-only")
    check_distinct(out, "out")


def check_distinct(a, name):
    """Raise ``ValueError`` when array ``a``, to be written, has a zero stride over more than one element.

    Such an array (``numpy.broadcast_to`` made writable, ``as_strided``, ``torch.zeros(1).expand(10)``)
    holds one memory place under several indices, so it cannot hold different values: a collective
    writing into it would return what only one of them received.

    Examples
    --------
    >>> from numpy.lib.stride_tricks import as_strided
    >>> check_distinct(numpy.zeros(3), "x")
    >>> check_distinct(as_strided(numpy.zeros(1), shape=(4,), strides=(0,)), "x")
    Traceback (most recent call last):
    ...
    ValueError: x has a zero stride (strides (0,), shape (4,)): its elements share memory, so they cannot hold different results; pass a contiguous array
    """
    if a.size > 1 and any(st == 0 and n > 1 for st, n in zip(getattr(a, "strides", ()) or (), a.shape)):
        raise ValueError(f"{name} has a zero stride (strides {tuple(a.strides)}, shape {tuple(a.shape)}): its elements "
                         "share memory, so they cannot hold different results; pass a contiguous array")



def check_allreduce(x, comm, op, algorithm, out, timeout, grid, accumulate="float32"):
    """Check every argument of an all-reduce (no message); return ``(comm, x, op, timeout, grid)`` as the call uses them.

    The one place the all-reduce's arguments are checked (:func:`collectives.allreduce`,
    :func:`collectives.iallreduce`, :func:`collectives.allreduce_init`), in the order the errors are
    reported: ``comm``, ``accumulate``, ``algorithm``, ``op``, ``x`` and its dtype, ``out``, ``timeout``, ``grid``.

    Parameters
    ----------
    x : array
        The input (NumPy or device array; DLPack tensors are adopted before).
    comm : mpi4py.MPI.Intracomm or None
        The communicator (None: ``COMM_WORLD``).
    op : str or mpi4py.MPI.Op
        The reduction.
    algorithm : str
        An all-reduce algorithm (:data:`collectives.ALGORITHMS`).
    out : array or None
        The result array.
    timeout : float or None
        Seconds.
    grid : tuple of int, "node", "topology" or None
        ``2d``'s rows x cols or ``torus``'s dimensions.
    accumulate : {"float32", "native"}

    Returns
    -------
    comm : mpi4py.MPI.Intracomm
    x : ndarray
        ``x`` as an array of its own module.
    op : str
        The op's name.
    timeout : float or None
    grid : tuple of int, str or None
        Checked against the communicator's size.

    Raises
    ------
    ValueError
        Unknown ``algorithm``, ``op`` or ``accumulate``; ``out`` of the wrong shape; a bad ``grid`` or ``timeout``.
    TypeError
        Unsupported dtype, ``out`` of another dtype, or ``comm`` that is no intracommunicator.

    Examples
    --------
    >>> comm, x, op, timeout, grid = check_allreduce(numpy.ones(4), None, "sum", "2d", None, 2, (1, 1))
    >>> op, timeout, grid
    ('sum', 2.0, (1, 1))
    >>> check_allreduce(numpy.ones(4), None, "mean", "ring", None, None, None)
    Traceback (most recent call last):
    ...
    ValueError: unknown op 'mean': expected one of sum, prod, min, max, avg (or mpi4py.MPI.SUM, PROD, MIN, MAX)
    """
    comm = check_comm(comm)
    if accumulate not in ("float32", "native"):
        raise ValueError(f"accumulate={accumulate!r} must be 'float32' or 'native'")
    if type(algorithm) is not str or algorithm not in _ALLREDUCE:
        check_algorithm(algorithm, "allreduce")
    if type(op) is not str:
        op = op_name(op)
    if type(op) is not str or op not in OPS:  # (an MPI op other than the four is no name: check_op names it)
        check_op(op)
    if type(x) is not numpy.ndarray:
        x = as_array(x)
    if x.dtype not in DTYPES:
        check_dtype(x.dtype)
    if out is not None:
        check_out(out, x)
    if timeout is not None:
        timeout = check_timeout(timeout)
    named = isinstance(grid, str) and grid in ("node", "topology")
    if isinstance(grid, str) and grid == "topology" and algorithm != "torus":
        raise ValueError("grid='topology' is for algorithm='torus'")
    if grid is not None and not named:
        size = comm.Get_size()
        grid = check_dims(grid, size) if algorithm == "torus" else check_grid(grid, size)
    return comm, x, op, timeout, grid


def check_collective(x, op, algorithm, collective, timeout):
    """Check the arguments of a reduce-scatter, broadcast or reduce (no message); return ``(x, op, timeout)``.

    Parameters
    ----------
    x : array
        The input.
    op : str, mpi4py.MPI.Op or None
        The reduction (None for broadcast, which has none).
    algorithm : str
        An algorithm of ``collective``.
    collective : {"reduce_scatter", "broadcast", "reduce"}
    timeout : float or None
        Seconds.

    Returns
    -------
    x : ndarray
    op : str or None
    timeout : float or None

    Raises
    ------
    ValueError
        Unknown ``algorithm`` or ``op``, a bad ``timeout``, a broadcast buffer with a zero stride.
    TypeError
        Unsupported dtype (broadcast moves bytes, so it takes :data:`collectives.backend.COPY_DTYPES`).

    Examples
    --------
    >>> check_collective(numpy.ones(2), "sum", "tree", "reduce", 1)[1:]
    ('sum', 1.0)
    >>> check_collective(numpy.ones(2), None, "tree", "reduce", None)
    Traceback (most recent call last):
    ...
    ValueError: unknown op None: expected one of sum, prod, min, max, avg (or mpi4py.MPI.SUM, PROD, MIN, MAX)
    """
    check_algorithm(algorithm, collective)
    if collective != "broadcast":  # every reducing collective needs an op; None is not "no reduction"
        op = op_name(op)
        check_op(op)
    x = as_array(x)
    check_dtype(x.dtype, allowed=DTYPES if collective != "broadcast" else COPY_DTYPES)
    if collective == "broadcast":  # written in place: as out= is (check_out)
        check_distinct(x, "x")
    return x, op, check_timeout(timeout)
