"""The damaged-checkpoint cases of the fault suite: a data-parallel checkpoint damaged in every way a
user or a crash damages one, loaded as ``--resume`` (and serving) loads it, in this process.

Each case writes a good checkpoint of a small model into a run directory that has a ``config.json``
with its run id, damages it, and loads it with :func:`training.checkpoint.load_checkpoint` and
:func:`training.state.restore`, the trainer's own path. Verdicts: ``pass`` when the load is refused
with a :class:`~training.checkpoint.CheckpointError` naming the file; ``silent-wrong`` when it is
accepted (damaged values would be trained on); ``fail`` for any other exception (a crash that does
not say what is wrong). The control case (an undamaged file) must load, and ``foreign-allowed`` (a
copy from another run with ``--allow-foreign-checkpoint``) must load too.

The parameter-server cases (:data:`PS_KINDS`) do the same with the two shards' files of a
``--mode ps`` run (``ps/ps_server0.npz``, ``ps/ps_server1.npz``, written by real servers), loaded as a
``--mode ps --resume`` loads them: the trainer's check on every rank
(:func:`training.ps_mode.worker.check_server_checkpoints`), then each server's own
(:func:`ps.store_checkpoint.restore_server`).
"""
import json
import os
import shutil
import tempfile
import zipfile

import numpy as np
from mpi4py import MPI

__all__ = ["KINDS", "PS_KINDS", "run_checkpoint_cases", "run_ps_checkpoint_cases"]

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


# ---------------------------------------------------------------------------------------------------
_PS_TOTAL, _PS_SHARDS = 12, 2  # a vector of 12 parameters in two shards, one worker (rank 2)


def _ps_server(g, run, **opts):
    """Server ``g`` of a two-shard job over ``run/ps`` (built on COMM_SELF: its constructor sends nothing)."""
    from ps.options import PSOptions
    from ps.server import Server
    from ps.sharding import shard_offsets
    from training.optim import SGD

    off = shard_offsets(_PS_TOTAL, _PS_SHARDS)
    options = PSOptions(servers=_PS_SHARDS, checkpoint_dir=os.path.join(run, "ps"), **opts)
    shard = np.linspace(-1, 1, _PS_TOTAL)[off[g]:off[g + 1]].copy()
    return Server(_SELF, g, [_PS_SHARDS], shard, _PS_TOTAL, options,
                  lambda p, gr: SGD(p, gr, lr=0.1, momentum=0.9))


def _ps_good(run, run_id, pushes=(8, 8)):
    """Write both shards' checkpoints of run ``run_id`` into ``run/ps`` (after ``pushes`` each); return the dir."""
    for g in range(_PS_SHARDS):
        srv = _ps_server(g, run, run_id=run_id)
        srv.pushes, srv.version = pushes[g], pushes[g]
        srv.table.folded[:] = pushes[g]
        srv.checkpoint()
    return os.path.join(run, "ps")


def _ps_file(ckpt, g=0):
    return os.path.join(ckpt, f"ps_server{g}.npz")


def _ps_foreign(ckpt, tmp):
    other = _run_dir(os.path.join(tmp, "other"), "1111")
    for g in range(_PS_SHARDS):
        shutil.copy(_ps_file(_ps_good(other, "1111"), g), _ps_file(ckpt, g))


def _ps_edit(key, value):
    return lambda ckpt, tmp: _rewrite(_ps_file(ckpt), lambda e: e.__setitem__(key, value))


def _ps_flip(ckpt, tmp):
    with zipfile.ZipFile(_ps_file(ckpt)) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    raw = bytearray(entries["params.npy"])
    raw[-3] ^= 0xFF
    entries["params.npy"] = bytes(raw)
    with zipfile.ZipFile(_ps_file(ckpt), "w") as z:
        for n, b in entries.items():
            z.writestr(n, b)


#: kind -> damage(ps_dir, tmp) of the two shards' files (server 0's unless the kind says otherwise).
PS_KINDS = {
    "control": lambda c, t: None,
    "truncated": lambda c, t: _truncate(_ps_file(c), t),
    "flipped-byte": _ps_flip,
    "empty-file": lambda c, t: open(_ps_file(c), "wb").close(),
    "foreign-run": _ps_foreign,
    "other-server": lambda c, t: shutil.copy(_ps_file(c, 1), _ps_file(c, 0)),
    "other-generation": lambda c, t: _rewrite(_ps_file(c, 1), lambda e: e.update(pushes=np.array(4),
                                                                             version=np.array(4))),
    "nan-params": lambda c, t: _rewrite(_ps_file(c), lambda e: e["params"].__setitem__(2, np.nan)),
    "integer-params": _ps_edit("params", np.arange(6)),
    "negative-pushes": _ps_edit("pushes", np.array(-8)),
    "updates-above-pushes": _ps_edit("version", np.array(9)),
    "negative-clock": _ps_edit("folded", np.array([-1])),
    "negative-optimizer-steps": _ps_edit("optim/steps", np.array(-1, np.int64)),
    "params-of-another-model": _ps_edit("params", np.zeros(7)),
    "other-worker-count": _ps_edit("folded", np.array([8, 8, 8])),
    "foreign-allowed": _ps_foreign,
}


def _ps_load(run, foreign_ok):
    """Load ``run/ps`` as ``--mode ps --resume`` does; return the joined shards."""
    from training.origin import run_id_of
    from training.ps_mode.worker import check_server_checkpoints

    ckpt, rid = os.path.join(run, "ps"), run_id_of(run) or ""
    check_server_checkpoints(ckpt, _PS_SHARDS, run_id=rid, allow_foreign=foreign_ok, job=(_PS_SHARDS, 1))
    return np.concatenate([_ps_server(g, run, run_id=rid, allow_foreign=foreign_ok, resume_dir=ckpt).params
                           for g in range(_PS_SHARDS)])


def run_ps_checkpoint_cases():
    """Run every kind of :data:`PS_KINDS`; return one result dict per case (as :func:`run_checkpoint_cases`)."""
    from training.checkpoint import CheckpointError

    results = []
    for kind, damage in PS_KINDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            run = _run_dir(os.path.join(tmp, "run"), "0000")
            damage(_ps_good(run, "0000"), tmp)
            try:
                params = _ps_load(run, foreign_ok=kind == "foreign-allowed")
                ok = kind in _MUST_LOAD and np.array_equal(params, np.linspace(-1, 1, _PS_TOTAL))
                verdict, detail = ("pass", "") if ok else ("silent-wrong", "accepted")
            except CheckpointError as exc:
                verdict = "pass" if kind not in _MUST_LOAD and "ps_server" in str(exc) else "fail"
                detail = str(exc)[:200]
            except Exception as exc:  # any other exception: a crash that says nothing useful
                verdict, detail = "fail", f"{type(exc).__name__}: {exc}"[:200]
        results.append({"case": f"ps_checkpoint/{kind}", "P": 1, "mode": "default", "verdict": verdict,
                        "detail": detail})
    return results
