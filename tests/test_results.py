"""The quiet-machine guard and the provenance record of results files (commlab/provenance.py), in one process.

Oracles: ``os.getloadavg`` (read before the guard and after the stamp: the recorded loads lie between
the two readings) and ``os.cpu_count``; a negative ``--max-load`` is exceeded by any load average, a
threshold of 1000 by none.
"""
import argparse
import os
import platform

import numpy as np
import pytest
from mpi4py import MPI

from commlab import provenance
from training.settings.options import real


def _args(*argv):
    parser = argparse.ArgumentParser()
    provenance.add_options(parser, real)
    return parser.parse_args(list(argv))


def test_guard_refuses_a_busy_machine_and_stamps_provenance():
    # (a) a threshold every load exceeds: refused, on a communicator too (rank 0's verdict), naming the way out
    for comm in (None, MPI.COMM_SELF):
        with pytest.raises(ValueError, match="--allow-noisy"):
            provenance.guard(_args("--max-load", "-1"), comm)
    # (b) the same load with --allow-noisy: a watch, and the file is marked noisy
    watch = provenance.guard(_args("--max-load", "-1", "--allow-noisy"))
    assert isinstance(watch, provenance.LoadWatch)
    noisy = provenance.stamp({"rows": []}, watch, P=2, command="python -m experiments.x --allow-noisy")
    assert noisy["provenance"]["noisy"] is True and noisy["provenance"]["max_load"] == -1
    assert noisy["provenance"]["command"] == "python -m experiments.x --allow-noisy" and noisy["rows"] == []
    # (c) a threshold no load reaches: quiet, and the record says where the file came from
    low = os.getloadavg()[0]
    watch = provenance.guard(_args("--max-load", "1000"), MPI.COMM_SELF)
    record = provenance.stamp({"rows": [1]}, watch, P=3)
    high = os.getloadavg()[0]
    prov = record["provenance"]
    assert prov["noisy"] is False and record["rows"] == [1]
    assert isinstance(prov["command"], str) and prov["command"]
    assert prov["versions"]["python"] == platform.python_version() and prov["versions"]["numpy"] == np.__version__
    assert prov["P"] == 3 and prov["cores"] == os.cpu_count() and prov["max_load"] == 1000
    lo, hi = min(low, high) - 0.01, max(low, high) + 0.01  # the summary rounds to 2 decimals
    assert lo <= prov["load"]["before"] <= hi and lo <= prov["load"]["during_max"] <= hi


def test_a_command_the_emulator_started_names_the_emulator_first_and_only_the_emulators_line_counts(monkeypatch):
    """``COMMLAB_EMULATED`` (set by training.emulator.emulate, :func:`cluster_line`) goes before the
    command and into ``emulated``; the published source line then shows no ``mpiexec -n P``. A value
    the emulator cannot have written (set by hand) is ignored."""
    from plots.publish.sources import source_line
    from training.emulator.emulate import ClusterConfig, cluster_line

    line = cluster_line(ClusterConfig(nodes=3, ranks_per_node=1, link="1gbit"))
    monkeypatch.setenv("COMMLAB_EMULATED", line)
    prov = provenance.provenance(P=3, command="python -m experiments.studies.hetero_study --workers 2")
    assert prov["emulated"] == line and prov["command"] == (
        "python -m training.emulator.emulate --nodes 3 --ranks-per-node 1 --link 1gbit -- "
        "python -m experiments.studies.hetero_study --workers 2")
    shown = source_line({**prov, "load": {"before": 0.1, "during_max": 1.0}}, "hetero_cluster/x.json")
    assert f"`{prov['command']}`" in shown and "mpiexec" not in shown, shown
    for forged in ("1", "mpiexec -n 2", "python -m training.emulator.emulate --nodes 2"):
        monkeypatch.setenv("COMMLAB_EMULATED", forged)
        prov = provenance.provenance(P=2, command="python -m x")
        assert (prov["emulated"], prov["command"]) == (None, "python -m x"), forged
        assert "`mpiexec -n 2 python -m x`" in source_line({**prov, "load": {"before": 0.1, "during_max": 1.0}}, "x")
