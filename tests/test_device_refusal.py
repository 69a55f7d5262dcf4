"""An object that exposes ``__cuda_array_interface__`` but is not a CuPy array (a Numba device array,
mpi4py's test backends) is refused by every collective with one ``TypeError`` that names CuPy and
DLPack, before any message; the fake class here stands in for such an array (no GPU needed)."""
import numpy as np
import pytest

import collectives


class _Bare:
    """Only the interface: no dtype, shape or flags."""

    def __init__(self):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


class _Described(_Bare):
    """The interface plus what a Numba device array also has (dtype, shape, size, nbytes)."""

    dtype, shape, size, nbytes, ndim = np.dtype(np.float32), (4,), 4, 16, 1


CALLS = {
    "allreduce": lambda x, alg: collectives.allreduce(x, algorithm=alg or "auto"),
    "iallreduce": lambda x, alg: collectives.iallreduce(x, algorithm=alg or "auto").wait(),
    "reduce_scatter": lambda x, alg: collectives.reduce_scatter(x, algorithm=alg or "ring"),
    "allgather": lambda x, alg: collectives.allgather(x, algorithm=alg or "ring"),
    "broadcast": lambda x, alg: collectives.broadcast(x, algorithm=alg or "tree"),
    "reduce": lambda x, alg: collectives.reduce(x, algorithm=alg or "tree"),
}


@pytest.mark.parametrize("kind", [_Bare, _Described])
@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("alg", [None, "mpi", "auto"])
def test_a_device_array_that_is_not_cupy_is_refused_naming_cupy_and_dlpack(kind, name, alg):
    with pytest.raises(TypeError, match=r"__cuda_array_interface__ but is not a CuPy array.*cupy\.asarray.*DLPack"):
        CALLS[name](kind(), alg)
