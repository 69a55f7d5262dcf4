"""Checkpoints of the ctr model's ranks, so that a ``--stop-after`` or killed run resumes exactly.

What each mode keeps, and where (``RUN_DIR/ps/``):

* ``ps`` and ``hybrid``: the servers checkpoint their pieces of the rows (in ``ps`` the MLP's rows too),
  their optimizer state and their clocks (:meth:`ps.serving.shard_server.Server.checkpoint`, ``ps_serverS.npz``) every
  ``--checkpoint-every`` epochs and when their loop ends;
* ``hybrid``: every worker also writes the MLP, its optimizer state and its gradient hook's state (a
  compressor's error feedback) after the same clocks, ``ctr_rank{R}-clock{C}.npz`` (``C``: the next clock
  to run), keeping the last two, so that the file of the clock the servers resume from is there even
  when a job was killed between a worker's write and the servers';
* ``dp``: every rank writes the same file with the whole flat vector (tables and MLP) in place of the MLP.

A resumed job takes its clock from the servers' checkpoints (the smallest clock they folded for each
worker; in ``dp`` the last clock every rank wrote) and loads each rank's file of that clock. Every rank
checks the files before the first message (:func:`resume_clock`), so a missing one is a ``ValueError`` on
every rank, not a hang. Files are written with :func:`commlab.file_formats.write_npz` (atomic, checksummed).
"""
import glob
import os
import re

import numpy as np

from commlab.file_formats import read_npz, write_npz
from ps.checkpoints.shard_files import newest_generation

__all__ = ["rank_checkpoint_path", "save_rank", "load_rank", "resume_clock", "checkpoint_due"]

_KEEP = 2  # files kept per rank (the servers' generation may be one behind a worker's)


def rank_checkpoint_path(ckpt_dir, rank, clock):
    """Return the checkpoint file of ``rank`` after ``clock`` steps in ``ckpt_dir``.

    Examples
    --------
    >>> rank_checkpoint_path("runs/a/ps", 3, 16)
    'runs/a/ps/ctr_rank3-clock00000016.npz'
    """
    return os.path.join(ckpt_dir, f"ctr_rank{rank}-clock{clock:08d}.npz")


def _clocks(ckpt_dir, rank):
    pattern = re.compile(rf"ctr_rank{rank}-clock(\d+)\.npz$")
    found = (pattern.search(p) for p in glob.glob(os.path.join(ckpt_dir, f"ctr_rank{rank}-clock*.npz")))
    return sorted(int(m.group(1)) for m in found if m)


def checkpoint_due(clock, stop, every):
    """Return True when a rank that has run ``clock`` steps writes its checkpoint.

    ``every`` steps (0: never in between) and at ``stop``, the job's last step, as the servers do.

    Examples
    --------
    >>> [c for c in range(1, 9) if checkpoint_due(c, 7, 3)]
    [3, 6, 7]
    """
    return clock == stop or bool(every) and clock % every == 0


def save_rank(ckpt_dir, rank, clock, params, opt, hook=None):
    """Write ``rank``'s state after ``clock`` steps and keep only its last two files.

    Parameters
    ----------
    ckpt_dir : str
        ``RUN_DIR/ps``.
    rank, clock : int
    params : ndarray, shape (n,)
        The flat parameters this rank holds (the MLP's; in ``dp`` the tables' and the MLP's).
    opt : training.model.optim.Optimizer
    hook : gradient hook, optional
        Its ``state_dict()`` (a compressor's error feedback) is saved beside.

    Examples
    --------
    >>> import tempfile
    >>> from training.model.optim import Adagrad
    >>> d, w = tempfile.mkdtemp(), np.arange(3.0)
    >>> opt = Adagrad(w, np.ones(3), lr=0.5)
    >>> opt.step()
    >>> for clock in (1, 2, 3):
    ...     save_rank(d, 0, clock, w, opt)
    >>> sorted(os.listdir(d))  # the last two
    ['ctr_rank0-clock00000002.npz', 'ctr_rank0-clock00000003.npz']
    >>> w2, opt2 = np.zeros(3), Adagrad(np.zeros(3), np.zeros(3))
    >>> load_rank(d, 0, 3, w2, opt2)
    >>> np.array_equal(w2, w), opt2.steps, opt2.accum.tolist()
    (True, 1, [1.0, 1.0, 1.0])
    """
    os.makedirs(ckpt_dir, exist_ok=True)
    state = {"clock": np.array(clock, np.int64), "model/params": params}
    state.update({f"optim/{k}": v for k, v in opt.state_dict().items()})
    if hook is not None:
        state.update({f"compression/{k}": v for k, v in hook.state_dict().items()})
    write_npz(rank_checkpoint_path(ckpt_dir, rank, clock), state)
    for old in _clocks(ckpt_dir, rank)[:-_KEEP]:
        os.remove(rank_checkpoint_path(ckpt_dir, rank, old))


def load_rank(ckpt_dir, rank, clock, params, opt, hook=None):
    """Restore what :func:`save_rank` wrote for ``clock`` into ``params``, ``opt`` and ``hook`` (in place).

    Raises
    ------
    ValueError
        When the file holds parameters of another shape (another model).
    commlab.file_formats.CheckpointError
        When the file is missing, corrupt or truncated.

    Examples
    --------
    See :func:`save_rank`.
    """
    state = read_npz(rank_checkpoint_path(ckpt_dir, rank, clock))
    if state["model/params"].shape != params.shape:
        raise ValueError(f"{rank_checkpoint_path(ckpt_dir, rank, clock)} holds {state['model/params'].size} "
                         f"parameters, this model has {params.size}; resume with the same model")
    params[...] = state["model/params"]
    opt.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("optim/")})
    if hook is not None:
        hook.load_state_dict({k[12:]: v for k, v in state.items() if k.startswith("compression/")})


def resume_clock(cfg, run_dir, S, W, layout=None):
    """Return each rank's clock to resume from (list, one per rank of the job), or None for a fresh start.

    Parameters
    ----------
    cfg : training.settings.config.Config
        ``resume``, ``mode``.
    run_dir : str
        The run directory being resumed.
    S, W : int
        Servers and workers (``S = 0`` in ``dp``).
    layout : ndarray, optional
        The rows' layout over the servers (:meth:`ps.shards.rows.RowSharding.fingerprint`): the servers' files
        must hold the same.

    Returns
    -------
    list of int or None
        ``clocks[r]`` for rank ``r`` (servers: 0); None when ``cfg.resume`` is unset or the run wrote no
        checkpoint yet (it starts over).

    Raises
    ------
    ValueError
        On every rank alike: the servers' files are of different generations, or a rank's file of the
        clock to resume from is missing.
    commlab.file_formats.CheckpointError
        On every rank alike, naming the file and the setting: the servers' rows were laid out otherwise
        (``--ctr-sharding``, ``--ctr-hot``).

    Examples
    --------
    >>> from training.settings.config import Config
    >>> resume_clock(Config(model="ctr", mode="hybrid"), "runs/x", 2, 2) is None  # not resuming
    True
    """
    if not cfg.resume:
        return None
    ckpt = os.path.join(run_dir, "ps")
    if S == 0:
        common = set(_clocks(ckpt, 0))
        for r in range(1, W):
            common &= set(_clocks(ckpt, r))
        return [max(common)] * W if common else None
    from training.ps_mode.worker import check_server_checkpoints

    if not check_server_checkpoints(ckpt, S, missing_ok=True, layout=layout):
        return None
    folded = np.min([read_npz(p)["folded"] for p in newest_generation(ckpt, S)], axis=0)
    clocks = [0] * S + [int(c) for c in folded]
    if cfg.mode == "hybrid":
        if len(set(clocks[S:])) > 1:
            raise ValueError(f"resume: the servers' checkpoints hold the workers at clocks {clocks[S:]} (an "
                             f"ASP or SSP run killed between two checkpoints); hybrid workers all-reduce "
                             f"every clock and resume together: resume from a run ended by --stop-after")
        for r in range(S, S + W):
            if clocks[r] and not os.path.exists(rank_checkpoint_path(ckpt, r, clocks[r])):
                raise ValueError(f"resume: the servers resume worker rank {r} at clock {clocks[r]} but "
                                 f"{rank_checkpoint_path(ckpt, r, clocks[r])} (its MLP and optimizer) is missing")
    return clocks
