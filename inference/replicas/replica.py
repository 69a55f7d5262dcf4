"""Model replicas: the wire format between the front rank and replicas, and the replica loop.

Every message is one float64 buffer (buffer-based MPI, no pickle) on a communicator duplicated for
serving, so serving messages never match anyone else's:

- work, front -> replica leader, tag :data:`TAG_WORK`: ``[kind, batch_id, n, x (n * F)]``, kind
  :data:`BATCH` or :data:`STOP`;
- reply, replica leader -> front, tag :data:`TAG_REPLY`: ``[batch_id, n, compute_s, comm_s, busy_s,
  logits (n * C)]`` (seconds measured on the replica);
- FIN, replica leader -> front after STOP, tag :data:`TAG_REPLY`: a reply header with batch id -1;
- a tensor-parallel leader forwards each work message to the other ranks of its group (tag
  :data:`TAG_GROUP`) before all of them run the forward together.

A replica waits by testing a nonblocking receive and sleeping ``poll_s`` between tests, so idle
ranks leave the cores to busy ones (MPICH's blocking receive spins).
"""
import time

import numpy
from mpi4py import MPI

__all__ = ["BATCH", "STOP", "TAG_WORK", "TAG_REPLY", "TAG_GROUP", "HEAD_WORK", "HEAD_REPLY",
           "ReplicaOptions", "serve_replica", "wait_request"]

BATCH, STOP = 1.0, 0.0
TAG_WORK, TAG_REPLY, TAG_GROUP = 11, 12, 13
HEAD_WORK, HEAD_REPLY = 3, 5  # header lengths (float64 elements) of work and reply messages


class ReplicaOptions:
    """Behaviour of one replica besides its model.

    Parameters
    ----------
    straggler : float
        Service-time multiplier, >= 1: after each batch the leader sleeps ``(straggler - 1)`` times
        the batch's busy time, so the replica is ``straggler`` times slower (a heterogeneous node).
    service_s : float
        Emulated accelerator time per batch (seconds, >= 0) slept by the leader after the forward;
        0 serves at the speed of the NumPy forward alone.
    fail_after : int or None
        Stop answering after this many batches (failure injection): the replica keeps draining its
        work messages but never replies again, until it is told to stop.
    poll_s : float
        Sleep between tests of a pending receive (seconds).
    """

    __slots__ = ("straggler", "service_s", "fail_after", "poll_s")

    def __init__(self, straggler=1.0, service_s=0.0, fail_after=None, poll_s=1e-4):
        if not straggler >= 1.0:
            raise ValueError(f"straggler must be >= 1, got {straggler!r}")
        if not service_s >= 0.0:
            raise ValueError(f"service_s must be >= 0 seconds, got {service_s!r}")
        if fail_after is not None and fail_after < 0:
            raise ValueError(f"fail_after must be >= 0 batches, got {fail_after!r}")
        self.straggler, self.service_s, self.fail_after, self.poll_s = straggler, service_s, fail_after, poll_s


def wait_request(req, poll_s, status=None):
    """Test ``req`` until it completes, sleeping ``poll_s`` seconds between tests."""
    while not req.Test(status):
        time.sleep(poll_s)


def _sleep_until(t_end):
    while True:
        left = t_end - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, 0.002) if left > 2e-4 else 0)


def serve_replica(comm, group, predictor, forward, options, front=0):
    """Run one replica rank until the front sends STOP (the leader answers FIN); return batches answered.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The serving communicator (front and every replica rank).
    group : mpi4py.MPI.Intracomm
        This replica's tensor-parallel group (size 1 for a replicated model); its rank 0 is the
        leader, which talks to the front.
    predictor : inference.replicas.predictor.Predictor
        Batch-invariant forward (for tensor parallelism, over ``forward``).
    forward : object or None
        The tensor-parallel forward (with ``comm_s`` and ``reset()``), or None.
    options : ReplicaOptions
    front : int
        Rank of the front in ``comm``.

    Returns
    -------
    int
    """
    F, C = predictor.n_features, predictor.n_classes
    buf = numpy.empty(HEAD_WORK + predictor.max_batch * F)
    status, answered, leader = MPI.Status(), 0, group.rank == 0
    pending_send = None
    while True:
        if leader:
            wait_request(comm.Irecv(buf, source=front, tag=TAG_WORK), options.poll_s, status)
            silent = options.fail_after is not None and answered >= options.fail_after
            if silent and buf[0] != STOP:
                continue  # failed: drains work, answers nothing
            count = status.Get_count(MPI.DOUBLE)
            for r in range(1, group.size):
                group.Send([buf[:count], MPI.DOUBLE], dest=r, tag=TAG_GROUP)
        else:
            wait_request(group.Irecv(buf, source=0, tag=TAG_GROUP), options.poll_s)
        if buf[0] == STOP:
            break
        batch_id, n = buf[1], int(buf[2])
        t0 = time.perf_counter()
        if forward is not None:
            forward.reset()
        logits = predictor.predict(buf[HEAD_WORK:HEAD_WORK + n * F].reshape(n, F))  # (n, C)
        compute = time.perf_counter() - t0
        comm_s = forward.comm_s if forward is not None else 0.0
        if not leader:
            continue
        busy = compute + options.service_s
        _sleep_until(t0 + busy * options.straggler)
        if pending_send is not None:
            wait_request(pending_send[0], options.poll_s)
        reply = numpy.empty(HEAD_REPLY + n * C)
        reply[:HEAD_REPLY] = (batch_id, n, compute - comm_s, comm_s, time.perf_counter() - t0)
        reply[HEAD_REPLY:] = logits.ravel()
        pending_send = (comm.Isend(reply, dest=front, tag=TAG_REPLY), reply)  # buffer lives until sent
        answered += 1
    if pending_send is not None:
        wait_request(pending_send[0], options.poll_s)
    if leader:  # FIN: nothing of this replica follows it on the wire
        fin = numpy.zeros(HEAD_REPLY)
        fin[0] = -1.0
        wait_request(comm.Isend(fin, dest=front, tag=TAG_REPLY), options.poll_s)
    return answered
