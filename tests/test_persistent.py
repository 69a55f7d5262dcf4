"""Persistent all-reduce plans and the blocking path's cached plans, on 3 ranks (a non-power of two).

Oracle: MPI's own ``MPI_Allreduce`` on the same data (see ``tests/mpi_persistent.py``); mismatched
calls on the cached path must raise on every rank.
"""
import numpy as np
import pytest

import collectives as C
from tests.mpirun import run_mpi


def test_plans_cached_path_mismatch_and_table_on_3_ranks():
    run_mpi(3, "tests.mpi_persistent", timeout=120)


def test_plan_arguments_are_checked_before_any_message():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="op"):
        C.allreduce_init(x, op="mean")
    with pytest.raises(TypeError, match="NumPy"):
        C.allreduce_init([1.0, 2.0])
    with pytest.raises(ValueError, match="shape"):
        C.allreduce_init(x, out=np.ones(5, np.float32))
