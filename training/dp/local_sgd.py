"""Local SGD and post-local SGD: H optimizer steps on each worker's own data, then the models averaged.

Local SGD (Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019, Algorithm 1):
every worker takes H optimizer steps on its own batches with no exchange, then the replicas are
averaged; the bytes per sample fall by H. Post-local SGD (Lin et al., "Don't Use Large Mini-Batches,
Use Local SGD", ICLR 2020, section 3): data-parallel steps (H = 1) up to a given epoch, local steps
after it. The average is of the change since the last average (``w = w_0 + avg(w_i - w_0)``), through
the run's gradient hook: any all-reduce algorithm, or a compressor with its error feedback.
:func:`weighted_average` instead weights each worker by its sample count (FedAvg's n_k / n, McMahan
et al., AISTATS 2017, Algorithm 1) in one all-reduce of counts and weighted values.

With plain SGD (momentum or not, weight decay or not) the update is linear in the gradient, so
averaging the models after every step (H = 1) gives the data-parallel parameters up to rounding.
Adam's update is not linear in the gradient: averaging Adam-updated models is not Adam on the
averaged gradient, even at H = 1.

Replicas are averaged at the end of every epoch as well, so evaluation and checkpoints see one model.
"""
import time

import numpy

import collectives
import collectives.engine.context
from training.dp.data_parallel import CONTROL_ALGORITHM, compute_gradient, is_finite
from commlab.arrays import get_array_module

__all__ = ["weighted_average", "LocalSGD", "local_step"]


def weighted_average(x, count, *, comm, algorithm="auto", timeout=None):
    """Return sum_i count_i x_i / sum_i count_i over the ranks: one all-reduce of ``[count x, count]``.

    The plain average of per-rank means, (1/P) sum_i x_i, is the mean of the whole data only when
    every rank averaged the same number of samples; with unequal shards the sample-weighted
    average is the mean of the union (for gradients: the full-batch gradient).

    Parameters
    ----------
    x : ndarray, shape (n,), float
        This rank's mean (e.g. the gradient averaged over its ``count`` samples).
    count : int or float
        This rank's number of samples (weight), >= 0; the weights' sum must be > 0.
    comm : mpi4py.MPI.Comm
    algorithm : str
        Any name in ``collectives.ALGORITHMS``.
    timeout : float, optional
        Seconds the all-reduce may wait for a peer.

    Returns
    -------
    ndarray, shape (n,), dtype of ``x``

    Raises
    ------
    ValueError
        When ``count`` is negative or the weights sum to 0 (on every rank).

    Examples
    --------
    >>> from mpi4py import MPI
    >>> weighted_average(numpy.array([2.0, 4.0]), 3, comm=MPI.COMM_SELF)
    array([2., 4.])
    """
    if not count >= 0:
        raise ValueError(f"count must be >= 0, got {count!r}")
    xp = get_array_module(x)
    buf = xp.empty(x.size + 1, x.dtype)
    xp.multiply(x.ravel(), count, out=buf[:-1])
    buf[-1] = count
    collectives.allreduce(buf, comm=comm, op="sum", algorithm=algorithm, out=buf, timeout=timeout)
    if not float(buf[-1]) > 0:
        raise ValueError("the weights sum to 0 over the ranks: no rank holds a sample")
    return (buf[:-1] / buf[-1]).reshape(x.shape)


class LocalSGD:
    """When and how the replicas of a local-SGD run are averaged.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    hook : callable
        The run's gradient hook (``hook(flat) -> (avg, info)``), applied to the change since the last
        average.
    local_steps : int
        H >= 1: optimizer steps between averages.
    post_local_epoch : int
        Epochs (1-based, inclusive) trained data-parallel (gradient all-reduce every step) before
        the local steps start; 0: local from the start.
    average_optimizer : bool
        Also average the optimizer's state (SGD velocity, Adam moments).
    weight : float, optional
        This rank's weight (its shard's samples): the average is :func:`weighted_average`'s, over
        the plain all-reduce; None: the hook's plain average.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from training.dp.hooks import AllreduceHook
    >>> local = LocalSGD(MPI.COMM_SELF, AllreduceHook(MPI.COMM_SELF), local_steps=4, post_local_epoch=1)
    >>> local.data_parallel(1), local.data_parallel(2), [local.due(i, 10) for i in range(10)].count(True)
    (True, False, 3)
    """

    __slots__ = ("comm", "hook", "local_steps", "post_local_epoch", "average_optimizer", "weight", "anchor")

    def __init__(self, comm, hook, local_steps=1, post_local_epoch=0, average_optimizer=False, weight=None):
        if not (isinstance(local_steps, int) and local_steps >= 1):
            raise ValueError(f"local_steps must be an integer >= 1, got {local_steps!r}")
        if not (isinstance(post_local_epoch, int) and post_local_epoch >= 0):
            raise ValueError(f"post_local_epoch must be an integer >= 0, got {post_local_epoch!r}")
        if weight is not None and not weight >= 0:
            raise ValueError(f"weight must be None or >= 0, got {weight!r}")
        self.comm, self.hook, self.local_steps = comm, hook, local_steps
        self.post_local_epoch, self.average_optimizer, self.weight = post_local_epoch, bool(average_optimizer), weight
        self.anchor = None

    def data_parallel(self, epoch):
        """Return True when epoch ``epoch`` (1-based) is trained data-parallel (post-local's first phase)."""
        return epoch <= self.post_local_epoch

    def due(self, i, per_epoch):
        """Return True when step ``i`` (0-based) of an epoch of ``per_epoch`` steps ends with an average."""
        return (i + 1) % self.local_steps == 0 or i + 1 == per_epoch

    def begin(self, params):
        """Take ``params`` (identical on every rank) as the point the next average starts from."""
        xp = get_array_module(params)
        self.anchor = xp.array(params, copy=True)

    def average(self, params, optimizer=None):
        """Average the replicas in place: ``params = anchor + avg(params - anchor)``; return the hook's info.

        Returns
        -------
        dict
            ``bytes_sent`` (bytes), ``compress_s``, ``decompress_s`` (seconds), possibly ``wire_bytes``.
        """
        if self.anchor is None:
            raise RuntimeError("LocalSGD.begin must be called before the first average")
        delta = params - self.anchor
        if self.weight is None:
            avg, info = self.hook(delta)
        else:
            avg = weighted_average(delta, self.weight, comm=self.comm, algorithm=self.hook.algorithm,
                                   timeout=self.hook.timeout)
            info = {"bytes_sent": _sent(self.comm), "compress_s": 0.0, "decompress_s": 0.0}
        params[...] = self.anchor + avg
        self.anchor[...] = params
        if self.average_optimizer and optimizer is not None:
            for arr in optimizer.state_dict().values():
                if getattr(arr, "ndim", 0) == 1 and arr.size == params.size:
                    collectives.allreduce(arr, comm=self.comm, op="avg", algorithm=CONTROL_ALGORITHM, out=arr,
                                          timeout=getattr(self.hook, "timeout", None))
                    info["bytes_sent"] += _sent(self.comm)
        return info


def _sent(comm):
    return int(collectives.engine.context.last_stats(comm).get("bytes_sent", 0))


def local_step(model, loss_fn, optimizer, local, x, y, sync, *, arrive=None):
    """Take one local optimizer step on this rank's batch; average the replicas when ``sync``.

    A non-finite loss or gradient skips this rank's update only (no exchange is made to agree on it).
    ``arrive``, as :func:`training.dp.data_parallel.train_step`'s, is called with the step's compute
    seconds once the step's computation is done (the injected slowness of ``--straggler`` and
    ``--jitter``, the monitor's heartbeat); its time counts as compute.

    Returns
    -------
    dict
        The keys of :func:`training.dp.data_parallel.train_step`'s record; ``bytes_sent`` is 0 on a
        step without an average.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from training.dp.hooks import AllreduceHook
    >>> from training.model.nn import SoftmaxCrossEntropy, build_mlp
    >>> from training.model.optim import SGD
    >>> model = build_mlp([4, 3], dtype="float64", seed=0)
    >>> opt = SGD(model.params, model.grads, lr=0.1)
    >>> local = LocalSGD(MPI.COMM_SELF, AllreduceHook(MPI.COMM_SELF), local_steps=2)
    >>> local.begin(model.params)
    >>> x, y = numpy.ones((5, 4)), numpy.zeros(5, numpy.int64)
    >>> [local_step(model, SoftmaxCrossEntropy(), opt, local, x, y, local.due(i, 4))["skipped"] for i in range(4)]
    [0, 0, 0, 0]
    """
    t0 = time.perf_counter()
    loss = compute_gradient(model, loss_fn, x, y)
    skip = not is_finite(loss, model.grads)
    if not skip:
        optimizer.step()
    if arrive is not None:
        arrive(time.perf_counter() - t0)
    t1 = time.perf_counter()
    info = local.average(model.params, optimizer) if sync else {"bytes_sent": 0, "compress_s": 0.0,
                                                                "decompress_s": 0.0}
    t2 = time.perf_counter()
    own = info["compress_s"] + info["decompress_s"]
    return {"loss": loss, "compute_s": (t1 - t0) + own, "comm_s": (t2 - t1) - own, "wait_s": 0.0,
            "transfer_s": (t2 - t1) - own, "compress_s": info["compress_s"], "decompress_s": info["decompress_s"],
            "bytes_sent": int(info["bytes_sent"]), "wire_bytes": int(info.get("wire_bytes", info["bytes_sent"])),
            "skipped": int(skip)}
