"""The torn-record cases of the fault suite: a run directory as a kill or a crash leaves it, restarted as documented.

A small run stopped after its second of three epochs (``--stop-after 2``, its ``summary.json``
removed: what a kill after that epoch's checkpoint leaves) is copied and damaged the way a kill
mid-write damages it: a torn last line in ``epochs.jsonl`` or ``metrics.jsonl`` (or a tail of zero
bytes), the temporary file of an atomic write left behind (``config.json``, a checkpoint, the
records' rewrite), ``config.json`` cut in half, a run killed before its first checkpoint or before
it wrote its configuration. It is then restarted as documented (``--resume RUN_DIR``; a run killed
before its first checkpoint, by the same ``--name``). The oracle is an uninterrupted run of the
same configuration. A case passes when the restart ends with that run's final parameters bit for bit,
``epochs.jsonl`` holding epochs 1, 2, 3 once each and no temporary file left (a torn line dropped
with a warning naming the file), or when it ends every rank with one ``error:`` line naming the
damaged file, without a traceback. A restart that ends with other parameters or records is a
*silent wrong answer*; one that fails without naming the file, *data lost*.

:mod:`experiments.faults.jobs` runs the cases, each restart a call of the trainer's
:func:`training.train.main` on every rank; rank 0 damages the copy and reads the result.
"""
import glob
import os
import shutil
import subprocess

import numpy as np

__all__ = ["RECORD_KINDS", "QUICK", "run_case", "verdict"]

#: Flags of the runs: 3 epochs of a small float64 model, a checkpoint after each.
_FLAGS = ("--data", "synthetic", "--samples", "240", "--features", "8", "--classes", "3", "--hidden", "16",
          "--batch-size", "24", "--epochs", "3", "--dtype", "float64", "--checkpoint-every", "1", "--no-progress",
          "--timeout", "10")


def _dead_pid():
    """Return the id of a process that has ended (the writer of a leftover temporary file)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _append(name, text):
    def damage(run):
        with open(os.path.join(run, name), "a", encoding="utf-8") as f:
            f.write(text)
    return damage


def _cut(name):
    def damage(run):
        path = os.path.join(run, name)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
    return damage


def _leftover(name, source):
    """A writer of ``name`` killed half-way through its temporary file (half of ``source``'s bytes)."""
    def damage(run):
        with open(os.path.join(run, source), "rb") as f:
            data = f.read()
        with open(os.path.join(run, f"{name}.tmp.{_dead_pid()}"), "wb") as f:
            f.write(data[:len(data) // 2])
    return damage


def _before_checkpoint(then):
    """Killed before its first checkpoint: no checkpoint and no epoch record; then ``then``'s damage."""
    def damage(run):
        for path in glob.glob(os.path.join(run, "ckpt-epoch*.npz")) + [os.path.join(run, "epochs.jsonl")]:
            os.remove(path)
        then(run)
    return damage


def _unconfigured(run):
    """Killed while it wrote its first ``config.json``: only that write's temporary file is there."""
    _leftover("config.json", "config.json")(run)
    for name in os.listdir(run):
        if ".tmp." not in name:
            os.remove(os.path.join(run, name))


#: kind -> (restart: ``resume``, ``resume-with-flags`` (the run's flags given again: it has no
#: configuration to resume from) or ``name`` (a new run of the same --name), damage(run_dir), the file
#: a warning must name (a torn line) or an error may name, or None).
RECORD_KINDS = {
    "torn-epochs-line": ("resume", _append("epochs.jsonl", '{"epoch": 3, "loss": 0.4'), "epochs.jsonl"),
    "torn-metrics-line": ("resume", _append("metrics.jsonl", '{"step": 99, "epo'), "metrics.jsonl"),
    "zero-filled-tail": ("resume", _append("epochs.jsonl", "\0" * 64), "epochs.jsonl"),
    "config-temporary": ("resume", _leftover("config.json", "config.json"), None),
    "checkpoint-temporary": ("resume", _leftover("ckpt-epoch0003.npz", "ckpt-epoch0002.npz"), None),
    "records-temporary": ("resume", _append("epochs.jsonl.tmp", '{"epoch": 1, "loss"'), None),
    "truncated-config": ("resume", _cut("config.json"), "config.json"),
    "truncated-config-before-checkpoint": ("name", _before_checkpoint(_cut("config.json")), "config.json"),
    "torn-line-before-checkpoint": ("name", _before_checkpoint(_append("metrics.jsonl", '{"st')), None),
    "never-configured": ("resume-with-flags", _unconfigured, None),
    "never-configured-by-name": ("name", _unconfigured, None),
}
#: The quick part's kinds (the full part runs every one of :data:`RECORD_KINDS`).
QUICK = ("torn-epochs-line", "config-temporary", "checkpoint-temporary", "truncated-config")
_TORN = {"torn-epochs-line", "torn-metrics-line", "zero-filled-tail"}


def _final(run):
    from commlab.file_formats import read_npz
    from training.runtime.checkpoint import find_checkpoint

    return read_npz(find_checkpoint(run))["model/params"]


def _prepare(runs, comm, job, prepared):
    """Once per launch: the uninterrupted run ``ref`` and the run ``base`` stopped after epoch 2."""
    if "status" not in prepared:
        a = job([*_FLAGS, "--run-dir", runs, "--name", "ref"])
        b = job([*_FLAGS, "--run-dir", runs, "--name", "base", "--stop-after", "2"])
        prepared.update(status=a[0] or b[0], output=a[1] + b[1])
        if comm.Get_rank() == 0 and not prepared["status"]:
            prepared["reference"] = _final(os.path.join(runs, "ref"))
            summary = os.path.join(runs, "base", "summary.json")
            if os.path.exists(summary):
                os.remove(summary)  # a killed job writes none
    return prepared


def run_case(kind, runs, comm, job, prepared):
    """Damage a copy of the stopped run, restart it on every rank through ``job(argv) -> (status, output)``.

    Returns this rank's record: the restart's status and output, and on rank 0 what the run holds
    then (``same``: the reference's final parameters; ``epochs``: ``epochs.jsonl``'s epochs;
    ``leftovers``: temporary files).
    """
    from commlab.file_formats import read_jsonl

    if _prepare(runs, comm, job, prepared)["status"]:
        return {"status": -1, "output": "the reference runs failed: " + prepared["output"][-2000:]}
    how, damage, _ = RECORD_KINDS[kind]
    run = os.path.join(runs, kind)
    if comm.Get_rank() == 0:
        shutil.copytree(os.path.join(runs, "base"), run)
        damage(run)
    comm.Barrier()
    argv = {"resume": ["--resume", run, "--no-progress", "--timeout", "10"],
            "resume-with-flags": [*_FLAGS, "--resume", run],
            "name": [*_FLAGS, "--run-dir", runs, "--name", kind]}[how]
    status, output = job(argv)
    rec = {"status": status, "output": output[-3000:]}
    if comm.Get_rank() == 0 and status == 0:
        try:
            epochs = [r.get("epoch") for r in read_jsonl(os.path.join(run, "epochs.jsonl"))]
        except ValueError as exc:
            epochs = str(exc)
        rec.update(same=bool(np.array_equal(_final(run), prepared["reference"])), epochs=epochs,
                   leftovers=sorted(n for n in os.listdir(run) if ".tmp" in n))
    return rec


def verdict(kind, recs):
    """Return (verdict, detail) of ``kind`` from every rank's record (``recs``: rank -> record)."""
    name = RECORD_KINDS[kind][2]
    text = "".join(recs[r]["output"] for r in sorted(recs))
    if any(rec["status"] for rec in recs.values()):
        lines = [t for t in text.splitlines() if t.startswith("error:")]
        if name and len(lines) == 1 and name in lines[0] and "Traceback" not in text:
            return "pass", lines[0][:200]
        return ("crash" if "Traceback" in text else "data-lost"), text[-300:]
    first = recs[0]
    if not first["same"] or first["epochs"] != [1, 2, 3]:
        return "silent-wrong", f"same parameters {first['same']}, epochs.jsonl {first['epochs']}"
    if first["leftovers"]:
        return "unclear", f"temporary files left: {first['leftovers']}"
    if kind in _TORN and not ("torn last line" in recs[0]["output"] and name in recs[0]["output"]):
        return "unclear", "no warning named the torn file: " + recs[0]["output"][-300:]
    return "pass", ""
