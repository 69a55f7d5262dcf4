"""The index of the experiments: every study and benchmark with one line, and any of them run by name.

    python -m experiments --list                    # every study and benchmark, one line each
    python -m experiments NAME [ARGS...]            # run one, e.g. python -m experiments trace --help
    mpiexec -n P python -m experiments NAME [ARGS...]

as ``python -m mpi4py.bench`` does. ``NAME`` is the module's own name (module names are unique inside
:mod:`experiments`); ``python -m experiments.SUBPACKAGE.NAME`` runs the same module. The list is
read from the modules' sources (each runnable module ends with ``if __name__ == "__main__"``; its
line is the first paragraph of its docstring), so listing imports none of them and starts no MPI.
"""
import ast
import os
import re
import runpy
import sys

__all__ = ["index", "main"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _runnable(path):
    """Return the docstring's first paragraph, as one line, of the module at ``path`` when it runs as a
    program, else None."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and getattr(node.test.left, "id", None) == "__name__"):
            first = " ".join((ast.get_docstring(tree) or "").split("\n\n", 1)[0].split())
            return re.sub(r":\w+:`~?([^`]+)`", r"\1", first).replace("``", "")
    return None


def index():
    """Return ``{name: (module, line)}`` of every runnable module of :mod:`experiments`, sorted by module.

    Returns
    -------
    dict
        ``name`` is the module's own name (``"trace"``), ``module`` its dotted path
        (``"experiments.bench.trace"``), ``line`` the first paragraph of its docstring as one line.

    Raises
    ------
    RuntimeError
        When two runnable modules share a name.

    Examples
    --------
    >>> from experiments.__main__ import index
    >>> index()["trace"][0]
    'experiments.bench.trace'
    """
    found = {}
    for root, dirs, files in sorted(os.walk(_HERE)):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        for f in sorted(files):
            if not f.endswith(".py") or f.startswith("_"):
                continue
            line = _runnable(os.path.join(root, f))
            if line is None:
                continue
            rel = os.path.relpath(os.path.join(root, f[:-3]), os.path.dirname(_HERE))
            module = rel.replace(os.sep, ".")
            name = f[:-3]
            if name in found:
                raise RuntimeError(f"two experiments are named {name}: {found[name][0]} and {module}")
            found[name] = (module, line)
    return dict(sorted(found.items(), key=lambda kv: kv[1][0]))


def main(argv=None):
    """List the experiments (``--list``) or run one (``NAME ARGS...``) as ``python -m`` would; return its status.

    Only the first argument is the index's own (``--list``, ``--help`` or ``NAME``); the rest are the
    experiment's, passed on as they are.
    """
    from training.settings.options import Parser

    argv = sys.argv[1:] if argv is None else list(argv)
    found = index()
    p = Parser(prog="python -m experiments", description=__doc__.split("\n\n", 1)[0],
               epilog="NAME's own options follow it: python -m experiments NAME --help")
    p.add_argument("--list", action="store_true", help="print every study and benchmark, one line each")
    p.add_argument("name", nargs="?", choices=list(found), metavar="NAME", help="the experiment to run")
    args = p.parse_args(argv[:1])
    if args.list:
        width = max(map(len, found))
        for name, (module, line) in found.items():
            print(f"{name:<{width}}  {line}")
        return 0
    if args.name is None:
        p.error("give the NAME of an experiment, or --list")
    module = found[args.name][0]
    sys.argv = [module, *argv[1:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code  # sys.exit(main()) exits as the module did
    return 0


if __name__ == "__main__":
    sys.exit(main())
