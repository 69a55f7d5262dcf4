"""The array-module helpers: array code written once for host (NumPy) and device (CuPy) arrays.

Numeric code in every layer starts with ``xp = get_array_module(x)`` and calls ``xp``'s functions, so
one body runs on NumPy and on CuPy (or another registered device array type); data moves to the host
only through :func:`to_host`, to be logged, written or plotted. CuPy is optional (the ``gpu`` extra)
and imported only when a CuPy array is seen.

Imports: NumPy only.

Examples
--------
>>> import numpy
>>> x = numpy.arange(3.0)
>>> get_array_module(x) is numpy, to_host(x) is x, is_device_array(x)
(True, True, False)
"""
import numpy

__all__ = ["get_array_module", "to_host", "is_device_array", "register_device_module"]

_DEVICE_MODULES = {}  # array type -> array module, for device arrays that are not CuPy's


def register_device_module(array_type, module):
    """Register the array module used for device arrays of ``array_type``.

    CuPy arrays are recognised without registration. Tests use this to drive the device code paths
    on the CPU with a host-memory array type that exposes ``__cuda_array_interface__``.

    Parameters
    ----------
    array_type : type
        Array class whose instances expose ``__cuda_array_interface__``.
    module : module-like
        Namespace with NumPy's array API (``empty``, ``add``, ``copyto``, ...) for that type.
    """
    _DEVICE_MODULES[array_type] = module


def to_host(a):
    """Return ``a`` as a NumPy array: device (CuPy) arrays are copied to the host, NumPy arrays are not copied.

    The one host copy of commlab (checkpoints, logs, plots, the parameter server's host shards).

    Parameters
    ----------
    a : array-like
        NumPy or CuPy array, or anything ``numpy.asarray`` takes.

    Returns
    -------
    numpy.ndarray
    """
    return a.get() if not isinstance(a, numpy.ndarray) and hasattr(a, "get") else numpy.asarray(a)


def is_device_array(x):
    """Return True when ``x`` lives in device memory (it exposes ``__cuda_array_interface__``)."""
    return hasattr(x, "__cuda_array_interface__")


def get_array_module(x):
    """Return the array module (NumPy or CuPy) that owns ``x``.

    Parameters
    ----------
    x : array-like
        NumPy array, CuPy array, a registered device array type, or anything ``numpy.asarray`` takes.

    Returns
    -------
    module
        ``numpy`` for host data, ``cupy`` for CuPy arrays, the registered module for other device types.
    """
    if type(x) is numpy.ndarray:
        return numpy
    for cls in type(x).__mro__:
        if cls in _DEVICE_MODULES:
            return _DEVICE_MODULES[cls]
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy  # optional dependency, imported only for CuPy input

        return cupy
    return numpy
