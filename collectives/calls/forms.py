"""The call form every public collective shares: the data first, everything else keyword-only.

:data:`FORMS` holds each collective's form; :func:`keyword_form` gives a collective that signature
for ``help()`` and ``inspect``; :func:`positional` answers a call in the former positional form
with a ``TypeError`` that names the keywords, on every rank alike, before any message is sent.

Imports: nothing of commlab (pure).
"""

__all__ = ["FORMS", "keyword_form", "positional"]

#: The call form of every public collective: the data first, everything else keyword-only, in one order.
FORMS = {
    "allreduce": 'allreduce(x, *, op="sum", comm=None, algorithm="auto", out=None, timeout=None, grid=None, '
                 'accumulate="float32")',
    "iallreduce": 'iallreduce(x, *, op="sum", comm=None, algorithm="auto", out=None, grid=None, accumulate="float32")',
    "allreduce_init": 'allreduce_init(x, *, op="sum", comm=None, algorithm="auto", out=None, grid=None, '
                      'accumulate="float32")',
    "reduce_scatter": 'reduce_scatter(x, *, counts=None, op="sum", comm=None, algorithm="ring", out=None, '
                      'timeout=None)',
    "allgather": 'allgather(x, *, comm=None, algorithm="ring", out=None, timeout=None)',
    "broadcast": 'broadcast(x, *, root=0, comm=None, algorithm="tree", timeout=None)',
    "reduce": 'reduce(x, *, op="sum", root=0, comm=None, algorithm="tree", timeout=None)',
}

#: The order of the arguments after the data in each collective's former positional form: a
#: positional call is told which keywords its arguments were meant for.
_POSITIONS = {
    "allreduce": ("comm", "op", "algorithm", "out", "timeout", "grid", "accumulate"),
    "iallreduce": ("comm", "op", "algorithm", "out", "grid", "accumulate"),
    "allreduce_init": ("comm", "op", "algorithm", "out", "grid", "accumulate"),
    "reduce_scatter": ("comm", "op", "algorithm", "timeout", "out"),
    "allgather": ("comm", "algorithm", "timeout", "out"),
    "broadcast": ("root", "comm", "algorithm", "timeout"),
    "reduce": ("root", "comm", "op", "algorithm", "timeout"),
}


def keyword_form(fn):
    """Give ``fn`` (a collective) the signature of its keyword-only form, for ``help()`` and ``inspect``.

    The collectives take ``*args`` only to answer a positional call with :func:`positional`; the
    signature shown leaves it out. Returns ``fn`` itself (no wrapper, no cost per call).

    Examples
    --------
    >>> import inspect
    >>> def f(x, *args, op="sum"):
    ...     pass
    >>> str(inspect.signature(keyword_form(f)))
    "(x, *, op='sum')"
    """
    import inspect

    sig = inspect.signature(fn)
    fn.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.kind is not p.VAR_POSITIONAL])
    return fn


def positional(name, args):
    """Raise ``TypeError`` for a collective called with more than its data positionally.

    Every rank making the same call raises it, before any message is sent.

    Parameters
    ----------
    name : str
        The collective, a key of :data:`FORMS`.
    args : tuple
        The extra positional arguments the caller gave.

    Raises
    ------
    TypeError
        Always; the message gives the keyword-only form.

    Examples
    --------
    >>> positional("allreduce", (None,))
    Traceback (most recent call last):
    ...
    TypeError: allreduce() takes only the data positionally, the rest by keyword: ...
    """
    meant = ", ".join(f"{k}=..." for k in _POSITIONS[name][:len(args)]) or "..."
    raise TypeError(f"{name}() takes only the data positionally, the rest by keyword: {FORMS[name]}; it was "
                    f"given {len(args)} more positional argument{'s' if len(args) > 1 else ''} (in the former "
                    f"positional order: {name}(x, {meant}))")
