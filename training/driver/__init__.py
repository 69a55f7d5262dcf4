"""The data-parallel driver's pieces, above every training mode.

:mod:`.preflight` checks a whole run's configuration against the job before anything is created,
:mod:`.trainer` builds (or restores with ``--resume``) a data-parallel run's parts before its run
directory exists, and :mod:`.elastic` trains data-parallel under ULFM, the survivors of a dead rank
going on. :mod:`training.train` is the command that runs them and hands the other modes their runs.

Imports: every other room of :mod:`training` (the modes :mod:`training.ps_mode` and
:mod:`training.model_parallel` included), :mod:`ps`, :mod:`collectives` and the floor below them;
never :mod:`training.train`.
"""
