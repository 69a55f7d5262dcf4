"""The option-mismatch cases of the fault suite: the ranks of one job started with different settings.

Each case is an MPMD launch (``mpiexec -n 1 python -m training.train --lr 0.1 : -n 1 python -m
training.train --lr 0.2``): rank 0's program is given one value of an option, the other ranks'
program another. The trainer must end every rank with a non-zero status and print one ``error:``
line naming the option, before anything is trained or any run directory is made, with no traceback
and no hang (:func:`training.driver.preflight.agree`, :func:`training.driver.preflight.agree_grid`, and
:func:`training.dp.layout.verify_param_layout` for ``--hidden`` and ``--dtype``).

:mod:`experiments.faults.jobs` runs many cases in one launch, each a call of the trainer's
:func:`training.train.main` on every rank; :func:`run_launches` (full part) launches
``python -m training.train`` itself once per case.
"""
import os
import tempfile

__all__ = ["OPTIONS", "QUICK", "BASE", "flags", "run_case", "verdict", "run_launches"]

#: Flags of every case: a small synthetic job, a 10 s limit on every wait (a rank left behind ends the
#: job in seconds, not at the 300 s default).
BASE = ("--data", "synthetic", "--samples", "120", "--features", "12", "--classes", "5", "--batch-size", "12",
        "--epochs", "1", "--no-progress", "--timeout", "10")
_PS = ["--mode", "ps", "--servers", "1"]


def _grid(P, last="16"):
    """A pipeline of P stages of one layer each (P - 1 hidden layers, the last one ``last`` wide)."""
    return ["--pipeline-parallel", str(P), "--hidden", ",".join(["16"] * (P - 2) + [last])]


#: case -> P -> (the option the error line must name, the flags of rank 0's program, of the others').
OPTIONS = {
    "lr": lambda P: ("lr", ["--lr", "0.1"], ["--lr", "0.2"]),
    "seed": lambda P: ("seed", ["--seed", "1"], ["--seed", "2"]),
    "optimizer": lambda P: ("optimizer", ["--optimizer", "sgd"], ["--optimizer", "adam"]),
    "hidden": lambda P: ("hidden", ["--hidden", "16"], ["--hidden", "32"]),  # the layout check's message
    "partition": lambda P: ("partition", [], ["--partition", "dirichlet:alpha=0.5"]),
    "ps-consistency": lambda P: ("consistency", [*_PS, "--consistency", "bsp"], [*_PS, "--consistency", "ssp"]),
    "stage-width": lambda P: ("hidden", _grid(P), _grid(P, "8")),  # a pipeline stage of another width
    "dtype": lambda P: ("dtype", ["--dtype", "float32"], ["--dtype", "float64"]),
    "batch-size": lambda P: ("batch-size", [], ["--batch-size", "24"]),
    "epochs": lambda P: ("epochs", [], ["--epochs", "2"]),
    "algorithm": lambda P: ("algorithm", ["--algorithm", "ring"], ["--algorithm", "tree"]),
    "compression": lambda P: ("compression", [], ["--compression", "topk"]),
    "mode": lambda P: ("mode", [], _PS),
    "ps-staleness": lambda P: ("staleness", [*_PS, "--consistency", "ssp", "--staleness", "1"],
                               [*_PS, "--consistency", "ssp", "--staleness", "2"]),
    "ps-servers": lambda P: ("servers", _PS, ["--mode", "ps", "--servers", "2"]),
    "micro-batches": lambda P: ("micro-batches", _grid(P), [*_grid(P), "--micro-batches", "2"]),
    "pipeline-driver": lambda P: ("pipeline-parallel", _grid(P), _grid(P)[2:]),  # the others off the grid
}
#: The quick part's cases (the full part runs every one of :data:`OPTIONS`).
QUICK = ("lr", "seed", "optimizer", "hidden", "partition", "ps-consistency", "stage-width")


def flags(name, role, P):
    """Return the trainer flags of case ``name`` for ``role`` (``"a"``: rank 0's program, ``"b"``: the others')."""
    _, a, b = OPTIONS[name](P)
    return [*BASE, *(a if role == "a" else b)]


def _made(run_dir):
    return os.path.isdir(run_dir) and bool(os.listdir(run_dir))


def run_case(name, role, P, run_dir, job):
    """Run case ``name`` on this rank through ``job(argv) -> (status, output)``; return its record."""
    status, output = job([*flags(name, role, P), "--run-dir", run_dir])
    return {"status": status, "made": _made(run_dir), "output": output[-3000:]}


def verdict(name, P, statuses, text, made):
    """Return (verdict, detail) of case ``name`` from every rank's exit status, the job's output and whether
    a run directory was made: ``pass``, ``silent-wrong`` (a rank trained), or ``unclear`` (no single
    ``error:`` line naming the option, a traceback, or a run directory)."""
    option = OPTIONS[name](P)[0]
    if any(s == 0 for s in statuses):
        return "silent-wrong", f"a rank trained with other settings (statuses {statuses})"
    lines = [t for t in text.splitlines() if t.startswith("error:")]
    if len(lines) == 1 and f"--{option}" in lines[0] and "Traceback" not in text and not made:
        return "pass", lines[0][:200]
    return "unclear", f"statuses {statuses}, made {made}: " + text[-300:]


def run_launches(launch, names, limit):
    """Launch ``python -m training.train`` itself for each case (``-n 1 ... : -n 1 ...``); return the results.

    ``launch``: :func:`experiments.faults.suite.launch`. A job killed at ``limit`` seconds is a hang.
    """
    results = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "runs")
            code, _, out = launch(1, "training.train", [*flags(name, "a", 2), "--run-dir", run], {}, limit,
                                  more=[(1, [*flags(name, "b", 2), "--run-dir", run])])
            found = ("hang", out[-300:]) if code is None else verdict(name, 2, [code], out, _made(run))
        results.append({"case": f"options-cli/{name}", "P": 2, "mode": "default", "verdict": found[0],
                        "detail": found[1]})
    return results
