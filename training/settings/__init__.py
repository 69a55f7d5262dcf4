"""A run's settings: the configuration, its command line, and the option parser of every command.

:mod:`.config` is the configuration dataclass (a comment with its unit on every field) and its JSON
form, :mod:`.cli` the command line of ``python -m training.train`` (one flag per field; a resumed
run's saved configuration under the flags given), and :mod:`.options` the parser with declared
ranges that every command of the project builds its command line with.

Imports: :mod:`training.runtime` (the saved configuration of a run being resumed), :mod:`training.data.datasets`
and :mod:`training.ctr` (the pure checks of a partition and of the ctr model's memory),
:mod:`collectives` and the floor below it; never a driver or a parallel mode's loop.
"""
