"""The damaged-checkpoint cases of the fault suite: a data-parallel checkpoint damaged in every way a
user or a crash damages one, loaded as ``--resume`` (and serving) loads it, in this process.

Each case writes a good checkpoint of a small model into a run directory that has a ``config.json``
with its run id, damages it, and loads it with :func:`training.checkpoint.load_checkpoint` and
:func:`training.state.restore`, the trainer's own path. Verdicts: ``pass`` when the load is refused
with a :class:`~training.checkpoint.CheckpointError` naming the file; ``silent-wrong`` when it is
accepted (damaged values would be trained on); ``fail`` for any other exception (a crash that does
not say what is wrong). The control case (an undamaged file) must load, and ``foreign-allowed`` (a
copy from another run with ``--allow-foreign-checkpoint``) must load too.
"""
import json
import os
import shutil
import tempfile
import zipfile

import numpy as np
from mpi4py import MPI

__all__ = ["KINDS", "run_checkpoint_cases"]

_SELF = MPI.COMM_SELF


def _run_dir(path, run_id):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"config": {}, "run": {"run_id": run_id}}, f)
    return path


def _good(run):
    """Write a good checkpoint of epoch 2 into ``run``; return its path."""
    from training.checkpoint import save_checkpoint

    path = os.path.join(run, "ckpt-epoch0002.npz")
    arrays = {"model/params": np.linspace(-1, 1, 12), "optim/steps": np.array(6, np.int64),
              "optim/velocity": np.zeros(12)}
    save_checkpoint(path, arrays, _SELF)
    return path


def _rewrite(path, change):
    """Rewrite ``path`` with ``change(entries)`` applied and the checksum recomputed (a deliberate edit)."""
    from ps.store import read_npz, write_npz

    entries = read_npz(path)
    change(entries)
    write_npz(path, entries)


def _truncate(path, _):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _flip(path, _):
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    name = "model/params.npy"
    raw = bytearray(entries[name])
    raw[-3] ^= 0xFF
    entries[name] = bytes(raw)
    with zipfile.ZipFile(path, "w") as z:
        for n, b in entries.items():
            z.writestr(n, b)


def _foreign(path, tmp):
    other = _run_dir(os.path.join(tmp, "other"), "1111")
    shutil.copy(path, os.path.join(other, os.path.basename(path)))
    return os.path.join(other, os.path.basename(path))


def _renamed(path, _):
    new = path.replace("epoch0002", "epoch0005")
    os.rename(path, new)
    return new


#: kind -> damage(path, tmp) returning the path to load (or None: the same path); checksum-level
#: damage first, then files that pass the checksum but come from elsewhere or make no sense.
KINDS = {
    "control": lambda p, t: None,
    "truncated": _truncate,
    "flipped-byte": _flip,
    "empty-file": lambda p, t: open(p, "wb").close(),
    "foreign-run": _foreign,
    "renamed-epoch": _renamed,
    "nan-params": lambda p, t: _rewrite(p, lambda e: e["model/params"].__setitem__(3, np.nan)),
    "integer-params": lambda p, t: _rewrite(p, lambda e: e.__setitem__("model/params", np.arange(12))),
    "negative-steps": lambda p, t: _rewrite(p, lambda e: e.__setitem__("optim/steps", np.array(-1, np.int64))),
    "params-of-another-model": lambda p, t: _rewrite(p, lambda e: e.__setitem__("model/params", np.zeros(7))),
    "foreign-allowed": _foreign,
}
_MUST_LOAD = ("control", "foreign-allowed")


class _Model:
    """The little model the cases restore into (12 float64 parameters), with SGD and momentum."""

    def __init__(self):
        from training.optim import SGD

        self.params, self.grads = np.zeros(12), np.zeros(12)
        self.size, self.dtype = 12, np.float64
        self.opt = SGD(self.params, self.grads, lr=0.1, momentum=0.9)


class _NoHook:
    def load_state_dict(self, d):
        pass


def _load(path, foreign_ok):
    from training.checkpoint import load_checkpoint
    from training.state import TrainState, restore

    name, arrays = load_checkpoint(path, _SELF, foreign_ok=foreign_ok)
    model, state = _Model(), TrainState()
    arrays.update({f"train/{k}": np.array(0) for k in TrainState.__slots__})
    restore(name, arrays, model, model.opt, _NoHook(), state)
    return model.params


def run_checkpoint_cases():
    """Run every kind; return one result dict per case (``case``, ``P``, ``mode``, ``verdict``, ``detail``)."""
    from training.checkpoint import CheckpointError

    results = []
    for kind, damage in KINDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            run = _run_dir(os.path.join(tmp, "run"), "0000")
            path = _good(run)
            path = damage(path, tmp) or path
            try:
                params = _load(path, foreign_ok=kind == "foreign-allowed")
                ok = kind in _MUST_LOAD and np.array_equal(params, np.linspace(-1, 1, 12))
                verdict, detail = ("pass", "") if ok else ("silent-wrong", "accepted")
            except CheckpointError as exc:
                named = os.path.basename(path) in str(exc)
                verdict = "pass" if kind not in _MUST_LOAD and named else "fail"
                detail = str(exc)[:200]
            except Exception as exc:  # any other exception: a crash that says nothing useful
                verdict, detail = "fail", f"{type(exc).__name__}: {exc}"[:200]
        results.append({"case": f"checkpoint/{kind}", "P": 1, "mode": "default", "verdict": verdict, "detail": detail})
    return results
