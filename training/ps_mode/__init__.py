"""Parameter-server training mode: the worker and server roles of a training job
(:mod:`.worker`, ``--mode ps``) and its report (:mod:`.report`). The protocol itself is :mod:`ps`.

Imports: the shared trainer modules of :mod:`training`, :mod:`training.dp`, :mod:`ps` and
:mod:`collectives`.
"""
