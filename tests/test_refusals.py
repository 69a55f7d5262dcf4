"""A call refused on one rank only: the other ranks raise an error naming it (debug mode) or time out.

The rank-side body is tests/mpi_refusals.py: one launch at P = 3 runs every collective x route x bad
argument, first in debug mode (``detail``: the refusing rank raises its own error, every other rank
``CollectiveMismatch`` naming it and its reason; then every rank refuses alike and the communicator
stays usable), then with ``timeout=`` in the default mode (the others raise ``CollectiveTimeout``
within the timeout; all-gather's signature exchange names the rank). Oracle: the refusing rank's own
error, checked on every rank by type and text; a hang is a failure at the launch's hard limit.
"""
import functools

import pytest

from tests.mpirun import run_mpi


@functools.lru_cache(maxsize=None)
def _launch():
    return run_mpi(3, "tests.mpi_refusals", "detail", "timeout", timeout=240, check=False)


@pytest.mark.parametrize("mode", ["detail", "timeout"])
def test_a_call_refused_on_one_rank_is_reported_on_every_rank(mode):
    res = _launch()
    assert f"mpi_refusals {mode}: 0 failures on 3 ranks" in res.stdout, (res.returncode, res.stdout[-4000:])
    assert res.returncode == 0, (res.returncode, res.stdout[-4000:])
