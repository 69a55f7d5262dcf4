"""Data-parallel training step: one step with the non-finite skip rule, and distributed evaluation.

The step averages the flat gradient with a *gradient hook* (:mod:`training.dp.hooks`:
:class:`AllreduceHook`, or a compressor from ``collectives.compression.make_hook``), between backward
and the optimizer step. An :class:`AllreduceHook` made with
``overlap=True`` instead starts each bucket's all-reduce during the backward pass
(:mod:`training.dp.overlap`, DDP's overlap).
"""
import hashlib
import time

import numpy

import collectives
import collectives.engine.context
from commlab import tracing
from commlab.arrays import to_host
from training.data.sampling import eval_shard

#: Algorithm of the small control reductions (non-finite flag, evaluation counts, digests): a
#: hand-made one, so that a timeout names the silent peer.
CONTROL_ALGORITHM = "recursive_doubling"

__all__ = ["CONTROL_ALGORITHM", "compute_gradient",
           "train_step", "evaluate", "any_rank", "is_finite", "replicas_identical"]


def compute_gradient(model, loss_fn, x, y, on_grad=None, scale=1.0):
    """Run forward and backward on one batch into ``model.grads`` (every element of it is this step's).

    The flat gradient is cleared first (one ``fill(0)``), so a parameter whose layer's
    ``backward`` does not run in this step contributes zero, never an earlier step's gradient --
    unless the model's backward overwrites all of it anyway
    (:meth:`training.model.nn.Sequential.writes_every_gradient`: the plain MLP of ``Linear`` layers), where
    the clearing would only cost a pass over the gradient's memory.

    Parameters
    ----------
    model : training.model.nn.Sequential
    loss_fn : training.model.nn.SoftmaxCrossEntropy
    x : ndarray, shape (B, F), model dtype
    y : ndarray, shape (B,), int64
    on_grad : callable, optional
        Passed to ``model.backward``: called with each layer's index once its gradients exist.
    scale : float
        Factor on the loss gradient the backward pass starts from, so ``model.grads`` holds ``scale``
        times the batch's mean gradient (the parameter gradients are linear in it).

    Returns
    -------
    float
        Mean loss over the batch (unscaled).
    """
    if not getattr(model, "writes_every_gradient", lambda: False)():
        model.grads.fill(0)
    with tracing.span("forward", "compute"):
        loss = loss_fn.forward(model.forward(x), y)
    with tracing.span("backward", "compute"):
        top = loss_fn.backward() if scale == 1.0 else loss_fn.backward() * scale
        if on_grad is None:
            model.backward(top)
        else:
            model.backward(top, on_grad=on_grad)
    return loss


def is_finite(loss, grad):
    """Return True when ``loss`` and every element of ``grad`` are finite.

    The check sums ``grad`` in float64: NaN and inf propagate through a sum, and float32 values
    cannot overflow a float64 accumulator.
    """
    if not numpy.isfinite(loss):
        return False
    return bool(numpy.isfinite(float(grad.sum(dtype=numpy.float64))))


def any_rank(flag, comm, timeout=None):
    """Return True on every rank when ``flag`` is true on any rank (all-reduce with max).

    Parameters
    ----------
    flag : bool
        This rank's flag.
    comm : mpi4py.MPI.Comm
    timeout : float, optional
        Seconds the all-reduce may wait for a peer (default: no limit).

    Raises
    ------
    collectives.CollectiveTimeout
        When a peer does not answer within ``timeout``.
    """
    buf = numpy.array([1 if flag else 0], numpy.int32)
    collectives.allreduce(buf, comm=comm, op="max", algorithm=CONTROL_ALGORITHM, out=buf, timeout=timeout)
    return bool(buf[0])


def train_step(model, loss_fn, optimizer, hook, comm, x, y, *, arrive=None, scale=1.0):
    """Take one data-parallel step; skip it on every rank if any rank sees a non-finite value.

    Steps: zero the flat gradient, forward/backward into it; a non-finite flag (loss or gradient) is
    all-reduced with max; if raised, every rank zeroes its gradient and skips both the gradient
    exchange and the update (parameters stay identical); otherwise ``hook`` averages the gradient
    and the optimizer updates the flat parameters. The flag's all-reduce waits at most
    ``hook.timeout`` seconds for a peer when the hook has that attribute.

    Parameters
    ----------
    model, loss_fn, optimizer, hook
        As built by ``training.train``.
    comm : mpi4py.MPI.Comm
    x : ndarray, shape (B / P, F); y : ndarray, shape (B / P,), int64
        This rank's share of the global batch.
    arrive : callable, optional
        Called as ``arrive(compute_s)`` with the step's seconds so far as this rank reaches the step's
        first collective: :func:`training.monitor.setup.arrival` (the delay ``--straggler`` injects, the
        live monitor's heartbeat). Its time counts as compute.
    scale : float
        This rank's weight in the average, applied to its gradient before the exchange
        (:func:`compute_gradient`): ``--weighted-average`` passes ``W n_w / sum_v n_v`` (``n_w`` the
        samples of this rank's shard), so the hook's plain average is the sample-weighted one,
        sum_w n_w g_w / sum_v n_v, whose expectation over the batches is the full-batch gradient
        (:func:`training.data.skew.gradient_scale`). 1: the plain average.

    Returns
    -------
    dict
        ``loss`` (this rank's mean batch loss), ``compute_s``, ``comm_s``, ``compress_s``,
        ``decompress_s`` (seconds), ``bytes_sent`` (bytes of payload this rank handed to the
        collectives), ``wire_bytes`` (bytes the collectives actually sent; equal to ``bytes_sent``
        without compression), ``skipped`` (0 or 1). ``comm_s`` = ``wait_s`` + ``transfer_s``:
        ``wait_s`` is the time in the non-finite flag's all-reduce, the step's first exchange, which
        returns once the last rank has arrived (skew: waiting for slower ranks, plus one small
        message's latency); ``transfer_s`` is the gradient exchange that follows, the ranks then
        in step, without compression and decompression; ``arrival_s``, the seconds from the step's
        start to this rank's arrival at that first exchange (its forward and backward, and overlap's
        bucket starts).

    Notes
    -----
    With :mod:`commlab.tracing` on, the step records ``step`` and the ``wait``, ``exchange``
    (with each bucket's ``allreduce`` inside), ``forward``, ``backward`` and ``optimizer`` events;
    a compressor's ``compress`` and ``decompress`` times are drawn at the start and the end of the
    exchange (their measured durations; PowerSGD's two phases each appear as one).

    With a hook whose ``overlap`` is true (:class:`AllreduceHook`), each bucket's all-reduce starts
    during the backward pass (:mod:`training.dp.overlap`) and the buckets are completed after the
    non-finite flag's all-reduce, which advances them while it waits; the parameters end bitwise as
    without overlap. ``compute_s`` then includes the backward pass's starting and testing of the
    buckets, ``transfer_s`` is the communication left after the backward pass (what overlap did not
    hide), and a skipped step has sent its buckets (``bytes_sent`` counts them) before discarding
    the averaged gradient.
    """
    t0 = time.perf_counter()
    step = hook.begin(model) if getattr(hook, "overlap", False) else None
    loss = compute_gradient(model, loss_fn, x, y, None if step is None else step.layer_done, scale)
    if step is None:
        bad = not is_finite(loss, model.grads)
    else:
        step.flush()
        bad = not (numpy.isfinite(loss) and step.finite)
    if arrive is not None:
        arrive(time.perf_counter() - t0)
    t1 = time.perf_counter()
    skip = any_rank(bad, comm, getattr(hook, "timeout", None))
    t2 = time.perf_counter()
    info = {"bytes_sent": 0, "compress_s": 0.0, "decompress_s": 0.0}
    if step is not None:
        info = step.wait()  # every rank started the same buckets: complete them, skipped step or not
        if skip:
            model.grads.fill(0)
    elif skip:
        model.grads.fill(0)
    else:
        avg, info = hook(model.grads)
        if avg is not model.grads:
            model.grads[...] = avg
    t3 = time.perf_counter()
    if not skip:
        optimizer.step()
    t4 = time.perf_counter()
    local = info["compress_s"] + info["decompress_s"]
    if tracing.enabled():
        _trace_step(t0, t1, t2, t3, t4, info, skip)
    return {"loss": loss, "compute_s": (t1 - t0) + (t4 - t3) + local,
            "comm_s": (t2 - t1) + (t3 - t2) - local, "wait_s": t2 - t1, "transfer_s": (t3 - t2) - local,
            "compress_s": info["compress_s"],
            "decompress_s": info["decompress_s"], "bytes_sent": int(info["bytes_sent"]),
            "wire_bytes": int(info.get("wire_bytes", info["bytes_sent"])), "skipped": int(skip),
            "arrival_s": t1 - t0}


def _trace_step(t0, t1, t2, t3, t4, info, skip):
    """Record one step's events from its time points (seconds): compute, wait, exchange, update."""
    tracing.complete("step", "step", t0, t4, {"skipped": int(skip)})
    tracing.complete("wait", "comm", t1, t2)
    if not skip:
        tracing.complete("exchange", "comm", t2, t3, {"bytes_sent": int(info["bytes_sent"])})
        if info["compress_s"]:
            tracing.complete("compress", "comm", t2, min(t3, t2 + info["compress_s"]))
        if info["decompress_s"]:
            tracing.complete("decompress", "comm", max(t2, t3 - info["decompress_s"]), t3)
        tracing.complete("optimizer", "compute", t3, t4)


def evaluate(model, loss_fn, x, y, comm, batch=1024, timeout=None):
    """Return (accuracy, mean loss) over ALL of (x, y), each sample counted exactly once.

    The caller passes the full arrays; rank r evaluates its ``training.data.sampling.eval_shard`` and the
    counts are summed with one all-reduce.

    Parameters
    ----------
    model : training.model.nn.Sequential
    loss_fn : training.model.nn.SoftmaxCrossEntropy
    x : ndarray, shape (N, F); y : ndarray, shape (N,), int64
    comm : mpi4py.MPI.Comm
    batch : int
        Samples per forward pass on this rank.
    timeout : float, optional
        Seconds the all-reduce of the counts may wait for a peer (default: no limit).

    Returns
    -------
    tuple of (float, float)
        Accuracy in [0, 1] and mean cross-entropy (NaN when N = 0).

    Raises
    ------
    collectives.CollectiveTimeout
        When a peer does not answer within ``timeout``.
    """
    part = eval_shard(len(y), comm.rank, comm.size)
    correct, loss_sum = 0, 0.0
    for lo in range(part.start, part.stop, batch):
        hi = min(lo + batch, part.stop)
        logits = model.forward(x[lo:hi])
        correct += int((logits.argmax(axis=1) == y[lo:hi]).sum())
        loss_sum += loss_fn.forward(logits, y[lo:hi]) * (hi - lo)
    buf = numpy.array([correct, loss_sum, part.stop - part.start], numpy.float64)
    collectives.allreduce(buf, comm=comm, op="sum", algorithm=CONTROL_ALGORITHM, out=buf, timeout=timeout)
    n = buf[2]
    return (buf[0] / n, buf[1] / n) if n else (float("nan"), float("nan"))


def replicas_identical(params, comm, timeout=None):
    """Return True on every rank when all ranks hold bitwise the same ``params``.

    Compares a 64-bit digest of the parameter bytes with one min and one max all-reduce, each
    waiting at most ``timeout`` seconds for a peer (default: no limit).

    Raises
    ------
    collectives.CollectiveTimeout
        When a peer does not answer within ``timeout``.
    """
    h = hashlib.blake2b(to_host(params).tobytes(), digest_size=8).digest()
    lo = numpy.frombuffer(h, numpy.int64).copy()
    hi = lo.copy()
    collectives.allreduce(lo, comm=comm, op="min", algorithm=CONTROL_ALGORITHM, out=lo, timeout=timeout)
    collectives.allreduce(hi, comm=comm, op="max", algorithm=CONTROL_ALGORITHM, out=hi, timeout=timeout)
    return bool(lo[0] == hi[0])
