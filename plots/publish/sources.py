"""The reference result files under ``plots/reference/`` and what every published table says of them: each
renderer loads its file (:func:`load`), refuses one measured on a busy machine (:func:`check_quiet`) and
ends its table with the file's provenance (:func:`source_line`).

Examples
--------
>>> from plots.publish.sources import source_line
>>> prov = {"command": "python -m experiments.cluster.ps run", "P": 9, "cores": 2, "date": "2026-12-03T17:00:00",
...         "load": {"before": 0.1, "during_max": 5.0}, "versions": {"python": "3.11.7", "numpy": "2.4.6"}}
>>> source_line(prov, "cluster/ps_study.json", launches_itself=True)[:60]
'*From `plots/reference/cluster/ps_study.json`: `python -m ex'
"""
import json
import os

__all__ = ["ROOT", "REFERENCE", "FIGURES", "load", "check_quiet", "source_line"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "plots", "reference")
FIGURES = os.path.join(ROOT, "plots", "figures")


def load(rel):
    """Return the JSON object of ``plots/reference/REL``; ``ValueError`` when it is not a results file."""
    path = os.path.join(REFERENCE, rel)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except ValueError as exc:
        raise ValueError(f"plots/reference/{rel}: not a JSON results file ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"plots/reference/{rel}: not a results file (a JSON object)")
    return data


def check_quiet(record, rel):
    """Raise ``ValueError`` unless ``record`` carries provenance of a quiet machine.

    Parameters
    ----------
    record : dict
        A results file's contents.
    rel : str
        Its path under ``plots/reference/`` (for the message).
    """
    prov = record.get("provenance") if isinstance(record, dict) else None
    if prov is not None and not isinstance(prov, dict):
        raise ValueError(f"plots/reference/{rel}: its provenance is not a record (a JSON object)")
    if prov is None:
        raise ValueError(f"plots/reference/{rel} has no provenance record: measure it again "
                         "(every study and benchmark writes one)")
    if prov.get("noisy", True):
        load = prov.get("load", {})
        raise ValueError(f"plots/reference/{rel} was measured on a busy machine (load {load.get('before')} "
                         f"before, {load.get('during_max')} at most during, threshold {prov.get('max_load')}): "
                         "it is never published")
    return prov


def source_line(prov, rel, launches_itself=False):
    """Return the one-line provenance that follows every published table (``launches_itself``: the
    command runs with plain ``python`` and starts its jobs itself, so no ``mpiexec`` is shown; nor for
    a command the emulated cluster launched, whose provenance names the emulator's command first)."""
    v = prov["versions"]
    lib = v.get("mpi_library") or "no MPI library"
    load = prov.get("load")
    where = (f"P = {prov['P']}, counts and accuracy (nothing timed)" if prov.get("timed") is False else
             "a simulation (no measurement)" if load is None or prov.get("P") is None else
             f"P = {prov['P']}, {prov['cores']} cores, load average {load['before']:.2f} before and "
             f"{load['during_max']:.2f} at most during")
    command = prov["command"]
    if (prov.get("P") and prov.get("load") is not None and not command.startswith("mpiexec") and not launches_itself
            and not prov.get("emulated")):
        command = f"mpiexec -n {prov['P']} {command}"
    return (f"*From `plots/reference/{rel}`: `{command}`, {where}, {lib}, Python {v['python']}, "
            f"NumPy {v['numpy']}, {prov['date'][:10]}.*")

