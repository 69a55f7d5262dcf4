"""The emulated multi-node cluster: network namespaces and ``tc`` shape the links
(:mod:`.net`), MPI's own launcher runs across them (:mod:`.launch`, :mod:`.emulate`), and the studies
run on it (collectives, compression, parameter server, calibration of the cost model), each
as one command that writes one results file with provenance (:mod:`.study`).

Imports: anything below :mod:`experiments`, and the job control of :mod:`experiments`.
"""
