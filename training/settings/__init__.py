"""A run's settings: the configuration, its command line, and the option parser of every command.

:mod:`.config` is the configuration dataclass (a comment with its unit on every field) and its JSON
form, :mod:`.cli` the command line of ``python -m training.train`` (one flag per field; a resumed
run's saved configuration under the flags given), and :mod:`.options` the parser with declared
ranges that every command of the project builds its command line with.

Imports: :mod:`training.data` and :mod:`training.ctr` (the pure checks of a partition and of the
ctr model's memory), :mod:`collectives` and the floor below it (a resumed run's saved
configuration); never a driver or a parallel mode's loop.
"""
