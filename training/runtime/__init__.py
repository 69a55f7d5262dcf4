"""What every training driver shares about one run: its parts, its files and what it shows.

:mod:`.build` builds a run's parts from its configuration (the model, each rank's sampler, the data
on the device), :mod:`.checkpoint` decides its run directory and writes and reads its checkpoints,
:mod:`.state` turns the trainer's state into checkpoint arrays and back, and :mod:`.progress` shows
the run (rank 0's progress bar, log lines with the rank in front, the trace file).

Imports: :mod:`training.model`, :mod:`training.data`, :mod:`ps` (the checkpoint file format),
:mod:`collectives` and the floor below them; never a parallel mode or a driver, which call it.
"""
