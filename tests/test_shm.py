"""The shared-memory algorithm (``algorithm="shm"``) on P = 1 to 5 ranks, one launch per P.

Oracle: MPI's own collectives on the same data (``tests/mpi_shm.py`` lists the cases: every dtype,
op and count, in place, persistent and zero-copy, the other four collectives, mismatched calls and
a rank that skips a call). Here also the refusals made before any message.
"""
import numpy as np
import pytest

import collectives as C
from collectives.shm.node import refuse_nodes
from tests.mpirun import run_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5])
def test_shm_collectives_against_mpi(nprocs):
    out = run_mpi(nprocs, "tests.mpi_shm", timeout=240).stdout
    assert "FAILED" not in out and out.count(": ok") == 14, out


class _Spread:
    """A context whose ranks span two nodes of two ranks each (what ``Context.nodes`` reports)."""

    def nodes(self):
        return (2, 2)


def test_shm_refuses_a_communicator_spanning_nodes():
    with pytest.raises(ValueError, match="needs every rank of the communicator on one node.*2 nodes"):
        refuse_nodes(_Spread(), "allreduce")


def test_shm_stages_device_arrays_and_refuses_bad_arguments_before_any_message():
    from tests.fakedevice import to_device

    y = C.allreduce(to_device(np.arange(3.0)), algorithm="shm")  # staged through host memory
    assert type(y).__name__ == "HostDeviceArray" and np.array_equal(np.asarray(y), np.arange(3.0))
    with pytest.raises(ValueError, match="host .NumPy. arrays"):
        C.iallreduce(to_device(np.ones(3)), algorithm="shm")
    with pytest.raises(ValueError, match="op"):
        C.allreduce(np.ones(3), op="mean", algorithm="shm")
    with pytest.raises(ValueError, match="unknown reduce_scatter algorithm"):
        C.reduce_scatter(np.ones(3), algorithm="shmem")
