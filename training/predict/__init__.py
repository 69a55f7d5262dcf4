"""The job predictor: a whole training step's time for any configuration on any cluster, from one run.

Three layers, as in ASTRA-sim (Rashidi et al., ISPASS 2020; Won et al., ISPASS 2023): the *workload*
is a job profile measured from one short traced run (:mod:`.profile`, after Daydream, Zhu et al.,
USENIX ATC 2020); the *system* is a configuration (:mod:`.job_config`: all-reduce algorithm, buckets,
overlap, compressor, parameter servers, data x tensor x pipeline grid); the *network* is a topology
file (:mod:`.topology`) turned into :class:`collectives.model.network.Network`. :mod:`.step` replays
one step on every rank, pricing each collective by replaying the executor's own schedules
(:mod:`.message_times`); :mod:`.scale` answers "which configuration is fastest" for 64 to 4,096 ranks on
example clusters; :mod:`.validate` compares predictions with step times measured on the emulated
cluster.

    python -m training.predict --trace FILE --topology FILE --config FILE_OR_KEY=VALUE...

Imports: :mod:`collectives`, the rest of :mod:`training` (bucket rule, pipeline schedules, layers,
checkpoint generations, option ranges) and the run provenance; never :mod:`training.emulator` (the
validation launches the emulator as a command), :mod:`inference`, :mod:`plots` or :mod:`experiments`.
Nothing here imports :mod:`mpi4py` itself.
"""
