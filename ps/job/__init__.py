"""A parameter-server job on a communicator: its settings (``settings``), the run with its roles and
worker loop (``runner``), the end-of-run report (``reports``) and a replicated run's report gathered
on a worker that survives any one server's death (``survivors``).

Imports: every other subpackage of ``ps``; nothing imports it but the package's face.
"""
