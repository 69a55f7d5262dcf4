"""commlab's floor: what every layer shares and none owns.

Every package of the project (``collectives``, ``ps``, ``training``, ``inference``, ``plots``,
``experiments``) may import these modules; they import nothing of the project, only the standard
library, NumPy and a few small libraries (``humanfriendly``), and never import mpi4py when they are
imported (a function that asks MPI imports it inside, when called). Each module is one role:

* :mod:`commlab.error_root`: :class:`~commlab.error_root.CommlabError`, the root of every error
  the project raises on purpose;
* :mod:`commlab.logs`: named loggers under ``commlab`` and a program's one-time log set-up
  (``[rank R] LEVEL: message``);
* :mod:`commlab.tracing`: the run's timeline as Chrome trace events (spans on lanes, gathered on
  one rank, written as one file);
* :mod:`commlab.byte_sizes`: byte counts parsed and formatted in binary units;
* :mod:`commlab.arrays`: the array-module helpers (``get_array_module``, ``to_host``): array code
  written once for NumPy and CuPy;
* :mod:`commlab.file_formats`: the checksummed, atomic ``.npz`` files, atomic JSON and JSON lines,
  and their error :class:`~commlab.file_formats.CheckpointError`;
* :mod:`commlab.run_files`: a run directory's records (``config.json`` with the run's identity,
  ``metrics.jsonl``, ``epochs.jsonl``) and the epoch table;
* :mod:`commlab.provenance`: what every results file carries (command, versions, P, host, load)
  and the quiet-machine guard that refuses to measure on a busy machine;
* :mod:`commlab.job_control`: ending a launched job with every process it started, telling whether
  an error was raised on every rank, and capping a process's thread pools.

Nothing is re-exported here: import each name from its module.
"""
