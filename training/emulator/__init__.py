"""The emulated multi-node cluster on one machine: network namespaces and ``tc`` shape the links
(:mod:`.net`), MPI's own launcher and TCP transport run across them (:mod:`.launch`), one command
builds the nodes and runs a job on them (:mod:`.emulate`: ``python -m training.emulator.emulate``),
and :mod:`.calibrate` measures the links it made (latency, bandwidth, duplex, fan-out) for the cost
model. The studies that run on it (:mod:`experiments.cluster`) and the job predictor's validation
(:mod:`training.predict.validate`) launch it as a command.

Imports: :mod:`mpi4py` (the calibration's messages), :mod:`commlab` (run provenance, the MPI
library's name) and :mod:`training`'s settings (the option ranges every command declares); nothing
else of the project.
"""
