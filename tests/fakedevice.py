"""A host-memory array type that looks like device memory, to drive the GPU code paths without a GPU.

``HostDeviceArray`` is a NumPy array subclass exposing ``__cuda_array_interface__`` (pointing at its
host memory), registered with :func:`commlab.arrays.register_device_module` under a NumPy-like
module. The collectives then take their device branches: stream synchronization before MPI, and
either direct hand-off (CUDA-aware) or pinned-host staging, selected with ``COMMLAB_CUDA_AWARE``.
"""
import types

import numpy as np

from commlab import arrays

__all__ = ["HostDeviceArray", "fake_xp", "to_device"]


class HostDeviceArray(np.ndarray):
    """NumPy array that advertises ``__cuda_array_interface__`` (version 3) over its host buffer."""

    @property
    def __cuda_array_interface__(self):
        iface = self.__array_interface__
        return {"shape": iface["shape"], "typestr": iface["typestr"], "data": iface["data"],
                "strides": iface["strides"], "version": 3, "stream": None}


def _empty(shape, dtype=float):
    return np.empty(shape, dtype=dtype).view(HostDeviceArray)


fake_xp = types.SimpleNamespace(
    __name__="fakedevice", empty=_empty, copyto=np.copyto, add=np.add, multiply=np.multiply,
    minimum=np.minimum, maximum=np.maximum, true_divide=np.true_divide, floor_divide=np.floor_divide,
    isnan=np.isnan,
)
arrays.register_device_module(HostDeviceArray, fake_xp)


def to_device(a):
    """Return a copy of ``a`` as a :class:`HostDeviceArray`."""
    return np.array(a).view(HostDeviceArray)
