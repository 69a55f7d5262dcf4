"""Sharded checkpoints of a hybrid run: each model-parallel rank writes its shard, any grid reads them.

A checkpoint is a directory ``RUN/shards-epochNNNN/`` with one file per (tensor, pipeline)
coordinate of data-parallel replica 0, ``shard-tT-qQ.npz`` (written by :func:`commlab.file_formats.write_npz`:
no pickle, SHA-256 inside, atomic), plus ``manifest.json`` written by rank 0 once every shard is
on disk, so a directory without it is an interrupted write and is never read. The manifest lists
every file with its SHA-256 and the epoch; loading requires exactly the listed files with those
checksums, every shard of that epoch, and parts that cover each tensor exactly once
(:func:`read_pieces`, :func:`assemble`). A shard holds, for
each tensor it owns a part of (``model/L3.W``: layer 3's weight; ``optim/m/L3.W``: Adam's first
moment of it), the part and its place in the full tensor (``place/NAME`` = axis, first index,
full shape; axis -1 for a whole replicated tensor), the optimizer's scalar state, the trainer's
counters and the configuration.

Re-sharding on load (Shoeybi et al. 2019's tensor split and any pipeline cut): every rank reads
the shards, assembles each full tensor of its own layers from the parts and takes its new part
with the layer's own split rule, so a checkpoint written on one grid resumes exactly on another.
A data-parallel checkpoint (``ckpt-epochNNNN.npz``, one flat vector) is read as a single shard, and a
sharded one resumes a data-parallel run (one whole replica per rank, :func:`restore_sharded`): a run
resumes from the newest checkpoint of either kind (:func:`newest_checkpoint`) on any layout whose
shapes allow it.
"""
import glob
import hashlib
import json
import os
import re
import types

import numpy

import collectives
from commlab.logs import get_logger
from training.runtime.checkpoint import epoch_checkpoints
from commlab.file_formats import CheckpointError, read_npz, write_npz
from commlab.run_files import run_id_of
from training.origin import check_origin
from training.model_parallel.grid import placement
from commlab.arrays import get_array_module
from training.dp.data_parallel import CONTROL_ALGORITHM
from training.runtime.state import check_values

__all__ = ["SHARDS_DIR", "shard_arrays", "save_sharded", "find_sharded", "newest_checkpoint", "read_pieces", "assemble",
           "load_sharded", "load_hook_state", "restore_sharded", "dense_params"]

_log = get_logger("training.model_parallel.sharded")

#: Name of a sharded checkpoint directory, ``shards-epochNNNN`` (epoch after which it was taken).
SHARDS_DIR = re.compile(r"^shards-epoch(\d+)$")


def _tensors(model, ks):
    """Yield (name, view, (axis, lo), layer, part) for W and b of each linear layer of the stage."""
    linear = [layer for layer in model.layers if hasattr(layer, "n_in")]
    for k, layer in zip(ks, linear):
        pw, pb = placement(layer)
        yield f"L{k}.W", layer.W, pw, layer, 0
        yield f"L{k}.b", layer.b, pb, layer, 1


def _full_shape(layer, part):
    return (layer.n_in, layer.n_out) if part == 0 else (layer.n_out,)


def shard_arrays(model, ks, opt, extra):
    """Return this rank's shard entries (see the module docstring); ``extra`` is added as is."""
    flat = {k: v for k, v in opt.state_dict().items() if getattr(v, "shape", None) == model.params.shape}
    d = {f"optim/{k}": v for k, v in opt.state_dict().items() if k not in flat}
    for name, view, (axis, lo), layer, part in _tensors(model, ks):
        full = _full_shape(layer, part)
        d[f"place/{name}"] = numpy.array([axis, lo, len(full), *full, *([1] * (2 - len(full)))], numpy.int64)
        d[f"model/{name}"] = view
        off = _flat_offset(model, view)
        for key, arr in flat.items():
            d[f"optim/{key}/{name}"] = arr[off:off + view.size].reshape(view.shape)
    d.update(extra)
    return d


def save_sharded(run_dir, epoch, grid, model, ks, opt, extra, comm, *, timeout=None, hook_state=None):
    """Write this run's sharded checkpoint after ``epoch``; collective over ``comm`` (all ranks).

    Replica ``d == 0`` writes the shard files; every rank learns whether all writes succeeded
    before rank 0 writes the manifest. A gradient hook's state (a compressor's error feedback,
    different on every rank) is written by every rank to ``hook-dD-tT-qQ.npz`` when not empty.
    ``model`` is this rank's part of the model, ``ks`` its shard layout and ``opt`` its optimizer;
    ``extra`` the run's counters saved beside them.

    Returns
    -------
    str
        The checkpoint directory.

    Raises
    ------
    CheckpointError
        On every rank, naming a file that could not be written.
    """
    path = os.path.join(run_dir, f"shards-epoch{epoch:04d}")
    err = ""
    try:
        os.makedirs(path, exist_ok=True)
        if grid.d == 0:
            write_npz(os.path.join(path, f"shard-t{grid.t}-q{grid.q}.npz"), shard_arrays(model, ks, opt, extra))
        if hook_state:
            write_npz(os.path.join(path, "hook-d{}-t{}-q{}.npz".format(*grid.coords())), hook_state)
    except (CheckpointError, OSError) as e:
        err = str(e)
    flag = numpy.array([1 if err else 0], numpy.int32)
    collectives.allreduce(flag, comm=comm, op="max", algorithm=CONTROL_ALGORITHM, out=flag, timeout=timeout)
    if flag[0]:
        raise CheckpointError(err or f"another rank could not write its shard of {path}")
    if comm.Get_rank() == 0:
        names = sorted(n for n in os.listdir(path) if n.endswith(".npz"))
        with open(os.path.join(path, "manifest.json.tmp"), "w", encoding="utf-8") as f:
            json.dump({"epoch": epoch, "run_id": run_id_of(run_dir), "grid": {"D": grid.D, "T": grid.T, "Q": grid.Q},
                       "files": {n: _sha256(os.path.join(path, n)) for n in names}}, f)
        os.replace(os.path.join(path, "manifest.json.tmp"), os.path.join(path, "manifest.json"))
    return path


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _checked_files(path, foreign_ok=False):
    """Return the shard files of checkpoint directory ``path`` after checking them against its manifest.

    Raises
    ------
    CheckpointError
        Naming the file: a listed file missing or with another checksum, a shard file the manifest
        does not list (left by another run or copied in), a manifest that is not one, or (unless
        ``foreign_ok``) a manifest whose run id is not that of the run directory holding it.
    """
    mpath = os.path.join(path, "manifest.json")
    try:
        with open(mpath, encoding="utf-8") as f:
            manifest = json.load(f)
        listed, epoch = manifest["files"], int(manifest["epoch"])
        if not isinstance(listed, dict):
            raise TypeError("files is not a mapping of file name to checksum")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{mpath}: not a readable manifest ({e})") from None
    here, held = run_id_of(os.path.dirname(os.path.abspath(path))), manifest.get("run_id")
    if here is not None and held != here and not foreign_ok:
        raise CheckpointError(f"{mpath}: written by run {held or '(no run id)'}, not by the run of "
                              f"{os.path.dirname(os.path.abspath(path))} ({here}): copied from another run. To "
                              "start from it on purpose, pass --allow-foreign-checkpoint")
    for name, digest in listed.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise CheckpointError(f"{file}: listed in the manifest but missing")
        if _sha256(file) != digest:
            raise CheckpointError(f"{file}: its checksum differs from the manifest's (changed or copied in after "
                                  "the checkpoint was written)")
    shards = sorted(glob.glob(os.path.join(path, "shard-t*-q*.npz")))
    extra = [f for f in shards if os.path.basename(f) not in listed]
    if extra:
        raise CheckpointError(f"{extra[0]}: a shard file the manifest does not list (from another checkpoint?)")
    return shards, epoch


def load_hook_state(path, grid, hook):
    """Restore this rank's gradient-hook state from checkpoint ``path``, when it holds any.

    Raises
    ------
    CheckpointError
        When the checkpoint holds hook state of another grid: per-rank state such as error
        feedback cannot be re-sharded.
    """
    if not os.path.isdir(path) or not glob.glob(os.path.join(path, "hook-d*.npz")):
        return
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
        saved = json.load(f)["grid"]
    if (saved["D"], saved["T"], saved["Q"]) != (grid.D, grid.T, grid.Q):
        raise CheckpointError(f"checkpoint {path} holds per-rank compressor state of grid "
                              f"{saved['D']}x{saved['T']}x{saved['Q']}; it resumes only on that grid "
                              f"(this run: {grid.D}x{grid.T}x{grid.Q})")
    hook.load_state_dict(read_npz(os.path.join(path, "hook-d{}-t{}-q{}.npz".format(*grid.coords()))))


def find_sharded(path):
    """Return the newest complete ``shards-epochNNNN`` directory in run directory ``path`` (or ``path``
    itself when it is one), or None when there is none; a newer directory without its manifest is
    skipped with a warning naming it."""
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return path
    dirs = sorted(p for p in glob.glob(os.path.join(path, "shards-epoch*")) if SHARDS_DIR.match(os.path.basename(p)))
    found = [p for p in dirs if os.path.isfile(os.path.join(p, "manifest.json"))]
    newer = [p for p in dirs if not found or p > found[-1]]
    if newer and newer[-1] not in found:  # an interrupted write, or a manifest lost since: say which is skipped
        _log.warning("%s has no manifest (an interrupted write?): skipped; %s", newer[-1],
                     f"reading {found[-1]} instead" if found else "no complete sharded checkpoint left")
    return found[-1] if found else None


def newest_checkpoint(path):
    """Return the newest checkpoint of run directory ``path`` of either kind, a complete ``shards-epochNNNN``
    directory or a ``ckpt-epochNNNN.npz`` file, by epoch; ``path`` itself when it names one; None when none.

    A run resumed on another layout writes the other kind, so its newest state may be either.
    """
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, "manifest.json")):
        return path
    if not os.path.isdir(path):
        return None
    sharded = find_sharded(path)
    found = [(int(SHARDS_DIR.match(os.path.basename(sharded)).group(1)), 1, sharded)] if sharded else []
    found += [(int(os.path.basename(p)[len("ckpt-epoch"):-len(".npz")]), 0, p) for p in epoch_checkpoints(path)]
    return max(found)[2] if found else None


def restore_sharded(path, model, opt, hook, state, comm, foreign_ok=False):
    """Load sharded checkpoint ``path`` into a data-parallel run's whole model on every rank of ``comm``.

    The parts of every tensor (parameters and the optimizer's per-parameter state) are assembled as on
    any grid (:func:`load_sharded`, a data-parallel run being the grid ``P x 1 x 1``); the counters and
    the configuration are the shards' common entries.

    Returns
    -------
    dict
        The configuration the checkpoint was written with (``{}`` when it holds none).

    Raises
    ------
    CheckpointError
        Naming the checkpoint, when it is unreadable or does not fit the model or optimizer, or holds
        per-rank compressor state of another grid (:func:`load_hook_state`).
    """
    linear = [layer for layer in model.layers if hasattr(layer, "n_in")]
    sizes = [linear[0].n_in] + [layer.n_out for layer in linear]
    pieces, common = read_pieces(path, sizes, foreign_ok)
    load_sharded(pieces, common, model, list(range(len(linear))), opt, path=path)
    rank = comm.Get_rank()
    load_hook_state(path, types.SimpleNamespace(D=comm.Get_size(), T=1, Q=1, coords=lambda: (rank, 0, 0)), hook)
    try:
        state.load_state_dict(common)
        saved = json.loads(bytes(common["meta/config"])) if "meta/config" in common else {}
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} does not fit this run: {e}") from None
    return saved if isinstance(saved, dict) else {}


def read_pieces(path, sizes=None, foreign_ok=False):
    """Read every shard of checkpoint ``path`` (a shards directory, or a data-parallel ``.npz``).

    ``sizes`` (the MLP's widths, input first) is needed to cut a data-parallel checkpoint's flat
    vector into layers.

    Returns
    -------
    tuple of (dict, dict)
        ``pieces``: tensor entry name -> list of (axis, lo, full shape, part); ``common``: the
        entries that are not tensor parts (``optim/steps``, ``train/...``, ``meta/...``).

    Raises
    ------
    CheckpointError
        Naming the file, when one is missing, corrupt or truncated, or (unless ``foreign_ok``)
        written by another run than the one whose directory holds it
        (:func:`training.origin.check_origin`).
    """
    if os.path.isdir(path):
        files, epoch = _checked_files(path, foreign_ok)
        if not files:
            raise CheckpointError(f"checkpoint {path} holds no shard files")
        shards = [read_npz(f) for f in files]
        for f, arrays in zip(files, shards):
            saved = arrays.get("train/epoch")
            if saved is not None and int(saved) != epoch:
                raise CheckpointError(f"{f}: a shard of epoch {int(saved)} in the checkpoint of epoch {epoch}")
    else:
        dense = read_npz(path)
        check_origin(path, dense, foreign_ok)
        shards = [_dense_as_shard(dense, path, sizes)]
    pieces, common = {}, {}
    for arrays in shards:
        for key, arr in arrays.items():
            if key.startswith("place/"):
                continue
            name = key.split("/")[-1]
            if (key.startswith("model/") or key.count("/") == 2) and f"place/{name}" in arrays:
                axis, lo, nd, *full = (int(v) for v in arrays[f"place/{name}"])
                pieces.setdefault(key, []).append((axis, lo, tuple(full[:nd]), arr))
            else:
                common.setdefault(key, arr)
    return pieces, common


def _dense_as_shard(arrays, path, sizes):
    """Turn a data-parallel checkpoint (flat ``model/params``, build_mlp layout) into one shard."""
    if "model/params" not in arrays or not sizes:
        raise CheckpointError(f"checkpoint {path} holds neither shards nor a data-parallel model")
    n = arrays["model/params"].size
    flat = {k[6:]: v for k, v in arrays.items() if k.startswith("optim/") and v.shape == (n,)}
    out = {k: v for k, v in arrays.items() if k != "model/params" and not (k[6:] in flat and k.startswith("optim/"))}
    off = 0
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        for name, shape in ((f"L{k}.W", (a, b)), (f"L{k}.b", (b,))):
            size = int(numpy.prod(shape))
            out[f"place/{name}"] = numpy.array([-1, 0, len(shape), *shape, *([1] * (2 - len(shape)))], numpy.int64)
            out[f"model/{name}"] = arrays["model/params"][off:off + size].reshape(shape)
            for key, arr in flat.items():
                out[f"optim/{key}/{name}"] = arr[off:off + size].reshape(shape)
            off += size
    if off != n:
        raise CheckpointError(f"checkpoint {path}: {n} parameters do not match widths {sizes}")
    return out


def assemble(pieces, key):
    """Return the full tensor ``key`` (e.g. ``model/L3.W``) put together from its parts.

    Raises
    ------
    CheckpointError
        When the parts do not cover the tensor exactly once (nothing is left uninitialised), or a
        part's values make no sense (:func:`training.runtime.state.check_values`: not finite floating-point
        numbers; checked part by part, as an integer part would be widened by its neighbours).
    """
    parts = pieces[key]
    try:
        for part in parts:
            check_values({key: part[3]})
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    axis, _, full, first = parts[0]
    if axis < 0:
        return first
    out = numpy.zeros(full, first.dtype)
    covered = numpy.zeros(full[axis], numpy.int64)
    for ax, lo, _, part in parts:
        if ax != axis or lo < 0 or lo + part.shape[ax] > full[ax]:
            raise CheckpointError(f"{key}: a part at {lo} along axis {ax} does not fit the tensor's shape {full}")
        idx = [slice(None)] * len(full)
        idx[ax] = slice(lo, lo + part.shape[ax])
        out[tuple(idx)] = part
        covered[lo:lo + part.shape[ax]] += 1
    if not (covered == 1).all():
        gaps, twice = int((covered == 0).sum()), int((covered > 1).sum())
        raise CheckpointError(f"{key}: the shards cover {gaps} of its {full[axis]} rows/columns along axis {axis} "
                              f"not at all and {twice} more than once (a shard missing, or one of another grid)")
    return out


def load_sharded(pieces, common, model, ks, opt, path=None):
    """Load this rank's parts of parameters and optimizer state, re-sharded for its layers.

    ``path`` (the checkpoint read by :func:`read_pieces`) is named in errors.

    Raises
    ------
    CheckpointError
        When a tensor is missing or has another shape (another model or optimizer), or its values
        make no sense (:func:`training.runtime.state.check_values`: not finite floating-point numbers, a
        negative step count).
    """
    flat = {k: v for k, v in opt.state_dict().items() if getattr(v, "shape", None) == model.params.shape}
    try:
        own = {}
        for name, view, _, layer, part in _tensors(model, ks):
            own.setdefault(id(layer), [layer, {}])[1][(name, part)] = view
        for layer, views in own.values():
            (nw, _), (nb, _) = sorted(views, key=lambda t: t[1])
            for prefix, target in [("model/", None)] + [(f"optim/{k}/", k) for k in flat]:
                W, b = assemble(pieces, prefix + nw), assemble(pieces, prefix + nb)
                if W.shape != (layer.n_in, layer.n_out) or b.shape != (layer.n_out,):
                    raise ValueError(f"{prefix + nw} has shape {W.shape}, the model's is {(layer.n_in, layer.n_out)}")
                w_part, b_part = layer.shard_of(W, b) if hasattr(layer, "shard_of") else (W, b)
                dst_w, dst_b = views[(nw, 0)], views[(nb, 1)]
                if target is not None:
                    dst_w, dst_b = (_same_place(model, flat[target], v) for v in (dst_w, dst_b))
                xp = get_array_module(dst_w)
                dst_w[...] = xp.asarray(w_part)
                dst_b[...] = xp.asarray(b_part)
        scal = {k[6:]: v for k, v in common.items() if k.startswith("optim/") and k.count("/") == 1}
        check_values({f"optim/{k}": v for k, v in scal.items()})  # a step count >= 0
        opt.load_state_dict({**scal, **flat})  # the flat arrays were filled in place above
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{'checkpoint ' + path if path else 'sharded checkpoint'} does not fit this run: "
                              f"{e}") from None


def _same_place(model, arr, view):
    """Return the view of flat ``arr`` at the place ``view`` has in ``model.params``."""
    off = _flat_offset(model, view)
    return arr[off:off + view.size].reshape(view.shape)


def _flat_offset(model, view):
    params = [p for layer in model.layers for p, _ in layer.parameters()]
    offsets = [o for _, o, _ in model.slices]
    for p, o in zip(params, offsets):
        if p is view:
            return o
    raise AssertionError("view is not a parameter of the model")


def dense_params(path, sizes):
    """Return the flat parameter vector, in ``build_mlp(sizes)`` order, of checkpoint ``path``."""
    pieces, _ = read_pieces(path, sizes)
    out = []
    for k in range(len(sizes) - 1):
        out += [assemble(pieces, f"model/L{k}.W").ravel(), assemble(pieces, f"model/L{k}.b")]
    return numpy.concatenate(out)
