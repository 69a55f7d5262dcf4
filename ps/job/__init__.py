"""A parameter-server job on a communicator: its settings (``settings``), the run and its worker loop
(``runner``), the ranks' roles and the end-of-run report (``reports``) and a replicated run's report
gathered on a worker that survives any one server's death (``survivors``).

Imports: every other subpackage of ``ps``; no other subpackage of ``ps`` imports it (the package's face,
the trainer and the tests do).
"""
