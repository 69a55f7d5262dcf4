"""The studies run on the emulated multi-node cluster (:mod:`training.emulator`: network namespaces
and ``tc`` shape the links, MPI's own launcher runs across them): collectives, compression, parameter
server, the CTR model's sparse traffic, and the fits of the two- and three-level cost models to its
sweeps (:mod:`.model`, :mod:`.levels`), each as one command that writes one results file with
provenance (:mod:`.study`, on :mod:`experiments.harness`).

Imports: anything below :mod:`experiments`, and :mod:`experiments.harness`.
"""
