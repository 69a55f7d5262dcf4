"""Live monitoring of a training run: per-rank metrics gathered to one rank while the job runs,
served in Prometheus' exposition format (``--metrics-port``) and written as TensorBoard scalars
(``--tensorboard``), with straggler and stall detection (docs/guide/monitoring.md).

:mod:`.setup` checks the options and opens the monitor of a run; :mod:`.sync` is the monitor of the
synchronous modes (data-parallel, hybrid grid: a small gather every N steps and per-step
heartbeats, :mod:`.heartbeat`), :mod:`.ps_reports` that of the parameter server (non-blocking
reports every few seconds); :mod:`.detect` holds the pure straggler and stall rules,
:mod:`.exporter` the metrics and their HTTP endpoint, :mod:`.board` the TensorBoard writer.

Imports: :mod:`ps` and :mod:`collectives` (nothing else of :mod:`training`); never
:mod:`training.dp` or the drivers, which call it.
"""
