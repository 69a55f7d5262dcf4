"""The damaged-checkpoint cases of the fault suite: a data-parallel checkpoint damaged in every way a
user or a crash damages one, loaded as ``--resume`` (and serving) loads it, in this process.

Each case writes a good checkpoint of a small model into a run directory that has a ``config.json``
with its run id, damages it, and loads it with :func:`training.runtime.checkpoint.load_checkpoint` and
:func:`training.runtime.state.restore`, the trainer's own path. Verdicts: ``pass`` when the load is refused
with a :class:`~commlab.file_formats.CheckpointError` naming the file; ``silent-wrong`` when it is
accepted (damaged values would be trained on); ``fail`` for any other exception (a crash that does
not say what is wrong). The control case (an undamaged file) must load, and ``foreign-allowed`` (a
copy from another run with ``--allow-foreign-checkpoint``) must load too.

The parameter-server cases (:data:`PS_KINDS`) do the same with the two shards' files of a
``--mode ps`` run (``ps/ps_server0.npz``, ``ps/ps_server1.npz``, written by real servers), loaded as a
``--mode ps --resume`` loads them: the trainer's check on every rank
(:func:`training.ps_mode.worker.check_server_checkpoints`), then each server's own
(:func:`ps.checkpoints.shard_files.restore_server`).

The sharded cases (:data:`SHARDED_KINDS`) damage a tensor-parallel run's ``shards-epochNNNN``
directory (two shard files and the manifest listing their checksums, epoch and run id) and read it
as a model-parallel ``--resume`` does: :func:`training.model_parallel.sharded.read_pieces`, every
tensor assembled from its parts, the step count checked; a refusal must name the checkpoint.
"""
import json
import os
import shutil
import tempfile
import zipfile

import numpy as np
from mpi4py import MPI

__all__ = ["KINDS", "PS_KINDS", "SHARDED_KINDS", "run_checkpoint_cases", "run_ps_checkpoint_cases",
           "run_sharded_checkpoint_cases"]

_SELF = MPI.COMM_SELF


def _run_dir(path, run_id):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"config": {}, "run": {"run_id": run_id}}, f)
    return path


def _good(run):
    """Write a good checkpoint of epoch 2 into ``run``; return its path."""
    from training.runtime.checkpoint import save_checkpoint

    path = os.path.join(run, "ckpt-epoch0002.npz")
    arrays = {"model/params": np.linspace(-1, 1, 12), "optim/steps": np.array(6, np.int64),
              "optim/velocity": np.zeros(12)}
    save_checkpoint(path, arrays, _SELF)
    return path


def _rewrite(path, change):
    """Rewrite ``path`` with ``change(entries)`` applied and the checksum recomputed (a deliberate edit)."""
    from commlab.file_formats import read_npz, write_npz

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
        from training.model.optim import SGD

        self.params, self.grads = np.zeros(12), np.zeros(12)
        self.size, self.dtype = 12, np.float64
        self.opt = SGD(self.params, self.grads, lr=0.1, momentum=0.9)


class _NoHook:
    def load_state_dict(self, d):
        pass


def _load(path, foreign_ok):
    from training.runtime.checkpoint import load_checkpoint
    from training.runtime.state import TrainState, restore

    name, arrays = load_checkpoint(path, _SELF, foreign_ok=foreign_ok)
    model, state = _Model(), TrainState()
    arrays.update({f"train/{k}": np.array(0) for k in TrainState.__slots__})
    restore(name, arrays, model, model.opt, _NoHook(), state)
    return model.params


def run_checkpoint_cases():
    """Run every kind; return one result dict per case (``case``, ``P``, ``mode``, ``verdict``, ``detail``)."""
    from commlab.file_formats import CheckpointError

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
    from ps.job.settings import PSOptions
    from ps.serving.shard_server import Server
    from ps.shards.key_ranges import shard_offsets
    from training.model.optim import SGD

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
    from commlab.run_files import run_id_of
    from training.ps_mode.worker import check_server_checkpoints

    ckpt, rid = os.path.join(run, "ps"), run_id_of(run) or ""
    check_server_checkpoints(ckpt, _PS_SHARDS, run_id=rid, allow_foreign=foreign_ok, job=(_PS_SHARDS, 1))
    return np.concatenate([_ps_server(g, run, run_id=rid, allow_foreign=foreign_ok, resume_dir=ckpt).params
                           for g in range(_PS_SHARDS)])


def run_ps_checkpoint_cases():
    """Run every kind of :data:`PS_KINDS`; return one result dict per case (as :func:`run_checkpoint_cases`)."""
    from commlab.file_formats import CheckpointError

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


# ---------------------------------------------------------------------------------------------------
#: The sharded cases' model: a 4-6-3 MLP on a tensor-parallel grid of T = 2 (two shard files): L0's
#: columns and L1's rows split in halves, L1's bias held whole by both shards.
_SIZES = {"L0.W": (4, 6), "L0.b": (6,), "L1.W": (6, 3), "L1.b": (3,)}
_AXES = {"L0.W": 1, "L0.b": 0, "L1.W": 0, "L1.b": -1}


def _full(name):
    shape = _SIZES[name]
    return np.linspace(-1, 1, int(np.prod(shape))).reshape(shape)


def _sharded_good(run, run_id, epoch=2):
    """Write the two shard files and the manifest of ``run/shards-epochNNNN`` as save_sharded does; return the dir."""
    from commlab.file_formats import write_npz

    path = os.path.join(run, f"shards-epoch{epoch:04d}")
    os.makedirs(path)
    for t in range(2):
        arrays = {"optim/steps": np.array(6, np.int64), "train/epoch": np.array(epoch, np.int64)}
        for name, shape in _SIZES.items():
            axis, full = _AXES[name], _full(name)
            lo = 0 if axis < 0 else t * shape[axis] // 2
            part = full if axis < 0 else np.take(full, range(lo, lo + shape[axis] // 2), axis=axis)
            arrays[f"place/{name}"] = np.array([axis, lo, len(shape), *shape, *([1] * (2 - len(shape)))], np.int64)
            arrays[f"model/{name}"], arrays[f"optim/velocity/{name}"] = part, np.zeros_like(part)
        write_npz(os.path.join(path, f"shard-t{t}-q0.npz"), arrays)
    _relist(path, run_id, epoch)
    return path


def _relist(path, run_id, epoch=2):
    """Write ``path``'s manifest listing the shard files as they are now (a deliberate edit passes it)."""
    import hashlib

    names = sorted(n for n in os.listdir(path) if n.endswith(".npz"))
    files = {n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest() for n in names}
    with open(os.path.join(path, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"epoch": epoch, "run_id": run_id, "grid": {"D": 1, "T": 2, "Q": 1}, "files": files}, f)


def _shard(ckpt, t=0):
    return os.path.join(ckpt, f"shard-t{t}-q0.npz")


def _sharded_edit(change, t=0):
    """Rewrite shard ``t`` with ``change(entries)`` and list its new checksum (it passes the manifest)."""
    def damage(ckpt, tmp):
        _rewrite(_shard(ckpt, t), change)
        _relist(ckpt, "0000")
    return damage


def _sharded_foreign(ckpt, tmp):
    other = _sharded_good(_run_dir(os.path.join(tmp, "other"), "1111"), "1111")
    for t in range(2):
        shutil.copy(_shard(other, t), _shard(ckpt, t))
    shutil.copy(os.path.join(other, "manifest.json"), os.path.join(ckpt, "manifest.json"))


def _swap(ckpt, tmp):
    os.rename(_shard(ckpt, 0), _shard(ckpt, 9))
    os.rename(_shard(ckpt, 1), _shard(ckpt, 0))
    os.rename(_shard(ckpt, 9), _shard(ckpt, 1))


def _sharded_other_epoch(ckpt, tmp):
    shutil.copy(_shard(_sharded_good(os.path.dirname(ckpt), "0000", epoch=1), 1), _shard(ckpt, 1))


#: kind -> damage(shards_dir, tmp) of a sharded checkpoint (shard 0's unless the kind says otherwise).
SHARDED_KINDS = {
    "control": lambda c, t: None,
    "missing-shard": lambda c, t: os.remove(_shard(c, 1)),
    "truncated": lambda c, t: _truncate(_shard(c), t),
    "unlisted-shard": lambda c, t: shutil.copy(_shard(c, 1), _shard(c, 7)),
    "swapped-coordinates": _swap,
    "shard-of-another-epoch": _sharded_other_epoch,
    "relisted-shard-of-another-epoch": _sharded_edit(lambda e: e.__setitem__("train/epoch", np.array(1))),
    "foreign-manifest": _sharded_foreign,
    "nan-part": _sharded_edit(lambda e: e["model/L0.W"].__setitem__((1, 1), np.nan), t=1),
    "integer-part": _sharded_edit(lambda e: e.__setitem__("model/L1.W", np.ones((3, 3), np.int64))),
    "negative-steps": _sharded_edit(lambda e: e.__setitem__("optim/steps", np.array(-1, np.int64))),
    "coverage-gap": _sharded_edit(lambda e: e["place/L0.W"].__setitem__(1, 1), t=1),
    "foreign-allowed": _sharded_foreign,
}


def _sharded_load(ckpt, foreign_ok):
    """Read ``ckpt`` as ``load_sharded`` does (read_pieces, every tensor assembled, the step count checked)."""
    from commlab.file_formats import CheckpointError
    from training.model_parallel.sharded import assemble, read_pieces
    from training.runtime.state import check_values

    pieces, common = read_pieces(ckpt, foreign_ok=foreign_ok)
    try:
        full = {k: assemble(pieces, k) for k in pieces}
        check_values({k: v for k, v in common.items() if k.startswith("optim/")})
    except ValueError as e:
        raise CheckpointError(f"checkpoint {ckpt} does not fit this run: {e}") from None
    return full


def run_sharded_checkpoint_cases():
    """Run every kind of :data:`SHARDED_KINDS`; return one result dict per case (as :func:`run_checkpoint_cases`)."""
    from commlab.file_formats import CheckpointError

    results = []
    for kind, damage in SHARDED_KINDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = _sharded_good(_run_dir(os.path.join(tmp, "run"), "0000"), "0000")
            damage(ckpt, tmp)
            try:
                full = _sharded_load(ckpt, foreign_ok=kind == "foreign-allowed")
                ok = kind in _MUST_LOAD and all(np.array_equal(full[f"model/{n}"], _full(n)) for n in _SIZES)
                verdict, detail = ("pass", "") if ok else ("silent-wrong", "accepted")
            except CheckpointError as exc:
                verdict = "pass" if kind not in _MUST_LOAD and os.path.basename(ckpt) in str(exc) else "fail"
                detail = str(exc)[:200]
            except Exception as exc:  # any other exception: a crash that says nothing useful
                verdict, detail = "fail", f"{type(exc).__name__}: {exc}"[:200]
        results.append({"case": f"sharded_checkpoint/{kind}", "P": 1, "mode": "default", "verdict": verdict,
                        "detail": detail})
    return results
