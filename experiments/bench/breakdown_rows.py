"""The timed rows of :mod:`experiments.bench.breakdown`: one :class:`Rows` per collective.

Each row is a zero-argument call timed alone in a loop. Every loop pays one Python call of the row
per iteration, so the row ``loop`` (a call that does nothing) is timed too: a step that runs inline
inside the collective costs its row less ``loop``. The derived rows are the part of a call that
no row times on its own, computed per pass from timed rows: ``whole - sum(parts) + (len(parts) - 1) * loop``
(each timed row carries one ``loop``, the inline parts none). Steps that are statements inside the
collective are timed as functions made of the same statements, on the same plan's buffers.
"""
from collections import namedtuple
from functools import partial

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.calls.signatures import cached_plan
from collectives.engine.context import existing_context
from collectives.engine.fingerprint import checks_enabled
from collectives.library.scatter_plan import cached_scatter_plan

__all__ = ["Rows", "allreduce_rows", "scatter_rows", "OPS"]

#: rows: {name: call}; free: releases what the rows hold; derived: {name: (whole row, part rows)};
#: ratios: {name: (numerator row, denominator row)}; whole: the row of the collective as a user calls it.
Rows = namedtuple("Rows", "rows free derived ratios whole")


def _empty(x, *args, op="sum", comm=None, algorithm="auto", out=None, timeout=None, grid=None, accumulate="float32"):
    """An empty function with :func:`collectives.allreduce`'s signature."""
    return x


def _tests(x, *args, op="sum", comm=None, algorithm="auto", out=None, timeout=None, grid=None, accumulate="float32"):
    """:func:`collectives.allreduce`'s signature and the tests that send a call to its cached plan, nothing else."""
    if (type(x) is np.ndarray and timeout is None and grid is None and type(op) is str and accumulate == "float32"
            and not args):
        return x
    return None


def _scatter_empty(x, *args, op="sum", comm=None, algorithm="ring", out=None, timeout=None):
    """An empty function with :func:`collectives.reduce_scatter`'s signature."""
    return x


def _scatter_tests(x, *args, op="sum", comm=None, algorithm="ring", out=None, timeout=None):
    """:func:`collectives.reduce_scatter`'s signature and its first tests, nothing else."""
    if args:
        return None
    if type(x) is np.ndarray and type(op) is str:
        return x
    return None


def _nothing():
    return None


def allreduce_rows(comm, x, algorithm):
    """Return the :class:`Rows` of a repeated blocking all-reduce of ``x`` (its cached plan made first).

    The call is ``allreduce(x, comm=comm, algorithm=algorithm)``: the public function's tests, the
    look-up (:func:`collectives.calls.signatures.cached_plan`), then ``plan.run(x, None)``
    (:meth:`collectives.library.plans.LibraryPlan._lean_run`), whose steps are the copy in, the
    library call, the check, the copy out and the statistics (sequence number, ``last_stats``).
    """
    out = np.empty_like(x)
    for _ in range(3):
        C.allreduce(x, comm=comm, algorithm=algorithm)
    plan = cached_plan(x, comm=comm, algorithm=algorithm)
    if plan is None or not plan.lean:
        raise ValueError(f"a {x.nbytes}-byte {algorithm} all-reduce on {comm.Get_size()} ranks has no cached "
                         "library plan (auto does not choose mpi at this size here, or debug mode is on)")
    dup, ctx, run = plan.ctx.comm, plan.ctx, plan.run
    init = dup.Allreduce_init(x, out, MPI.SUM)
    persistent = C.allreduce_init(x, comm=comm, algorithm=algorithm, out=out)
    shaped, shaped_result, tail, want, dtype = plan.shaped, plan.shaped_result, plan.tail, plan.want, plan.dtype
    iallreduce, args, record, nbytes = dup.Iallreduce, (plan.work, plan.recv, plan.mpi_op), plan.record, plan.nbytes

    def pers():
        persistent.start()
        persistent.wait()

    def start_wait():
        init.Start()
        init.Wait()

    def copy_in():
        shaped[...] = x

    def library_call():
        iallreduce(*args).Wait()

    def check():
        if tail.tobytes() != want:
            raise RuntimeError("check elements differ")

    copy_out = shaped_result.copy if dtype == plan.result.dtype else partial(shaped_result.astype, dtype)  # as run

    def statistics():  # every rank runs it as often, so the sequence stays in step
        ctx._seq += 1
        ctx.last = record
        ctx.calls += 1
        ctx.bytes_sent += nbytes

    rows = {"MPI_Allreduce": lambda: dup.Allreduce(x, out, MPI.SUM),
            "MPI_Iallreduce+Wait": lambda: dup.Iallreduce(x, out, MPI.SUM).Wait(),
            "MPI_Allreduce_init": start_wait, "persistent plan": pers,
            "auto": lambda: C.allreduce(x, comm=comm, algorithm=algorithm),
            "look-up": lambda: cached_plan(x, comm=comm, op="sum", algorithm=algorithm),
            "plan.run": lambda: run(x, None),
            "copy in": copy_in, "library call": library_call, "check": check, "copy out": copy_out,
            "statistics": statistics, "loop": _nothing,
            "empty call": lambda: _empty(x, comm=comm, algorithm=algorithm),
            "call and tests": lambda: _tests(x, comm=comm, algorithm=algorithm)}
    steps = ["copy in", "library call", "check", "copy out", "statistics"]
    derived = {"public entry": ("auto", ["look-up", "plan.run"]), "in the plan": ("plan.run", steps),
               "rest": ("auto", ["look-up"] + steps), "keyword-only call": ("empty call", []),
               "call and its tests": ("call and tests", [])}
    ratios = {"auto / MPI_Iallreduce+Wait": ("auto", "MPI_Iallreduce+Wait"),
              "persistent plan / MPI_Allreduce": ("persistent plan", "MPI_Allreduce"),
              "MPI_Iallreduce+Wait / MPI_Allreduce": ("MPI_Iallreduce+Wait", "MPI_Allreduce"),
              "MPI_Allreduce_init / MPI_Allreduce": ("MPI_Allreduce_init", "MPI_Allreduce")}

    def free():
        init.Free()
        persistent.free()
    return Rows(rows, free, derived, ratios, "auto")


def scatter_rows(comm, x, algorithm):
    """Return the :class:`Rows` of a repeated blocking reduce-scatter of ``x`` into ``out`` (plan made first).

    The call is ``reduce_scatter(x, comm=comm, op="sum", algorithm=algorithm, out=out)``, as the sweep
    makes it: the public function's tests, the look-up (:func:`collectives.calls.reduce_scatter._repeated_scatter`
    up to the plan's one-frame form) and that form (``plan.fast``,
    :meth:`collectives.library.scatter_plan.ScatterPlan._fast_run`), whose steps are both library calls
    (the 16-byte fingerprint ``MPI_Iallreduce`` and ``MPI_Ireduce_scatter_block``, posted together and
    waited), the fingerprint's check and the statistics (sequence number, ``last_stats``).
    Row ``MPI_Ireduce_scatter_block+Wait`` is the library call commlab posts: the block form when the
    chunks are equal, ``MPI_Ireduce_scatter`` with the counts otherwise (2 elements on 4 ranks).
    """
    P = comm.Get_size()
    probe = C.reduce_scatter(x, comm=comm, op="sum", algorithm=algorithm)
    out = np.empty(probe.shape, x.dtype)
    for _ in range(3):
        C.reduce_scatter(x, comm=comm, op="sum", algorithm=algorithm, out=out)
    ctx = existing_context(comm)
    signature = ("reduce_scatter", algorithm, "sum", x.dtype, x.shape, checks_enabled())
    plan = None if ctx is None else ctx.fast.get(signature)
    if plan is None or plan.fast is None:
        raise ValueError(f"a {x.nbytes}-byte {algorithm} reduce-scatter on {P} ranks has no cached one-frame library "
                         "plan (auto does not choose mpi at this size here, or debug mode is on)")
    send, mine = x.reshape(-1), out.reshape(-1)
    _, (pfp, want), _, (method, _), kind, record = plan._lean
    statuses = [MPI.Status() for _ in range(2)]
    dup, counts, mop, fast = ctx.comm, plan.counts, plan.mpi_op, plan.fast
    args = plan._args(send, mine, mop)  # the reference rows: the arrays as a direct mpi4py call passes them
    posted = plan._args([send, kind], [mine, kind], mop)  # as the plan posts them, datatypes given
    fp = np.frombuffer(want, np.int64).copy()  # a private pair: the references leave the plan's alone
    fp_spec = [MPI.buffer(fp), 2, MPI.INT64_T]

    def both():
        MPI.Request.Waitall([dup.Iallreduce(MPI.IN_PLACE, fp_spec, MPI.MAX), method(*posted)], statuses)

    def look_up():  # _repeated_scatter's statements up to plan.fast
        p = cached_scatter_plan(x, comm=comm, op="sum", algorithm=algorithm, out=out)
        if p is None:
            return None
        c, f = p.ctx, p.fast
        if f is not None and out is not None and c.broken is None and not c.active and p.current():
            return None
        return None

    def check():
        if pfp.tobytes() != want:
            raise RuntimeError("fingerprint differs")

    def statistics():  # every rank runs it as often, so the sequence stays in step
        ctx._seq += 1
        ctx.last = record
        ctx.calls += 1
        ctx.bytes_sent += record.bytes_sent

    rows = {"MPI_Reduce_scatter": lambda: dup.Reduce_scatter(x, out, counts, mop),
            "MPI_Ireduce_scatter_block+Wait": lambda: method(*args).Wait(),
            "MPI_Iallreduce 16 B+Wait": lambda: dup.Iallreduce(MPI.IN_PLACE, fp, MPI.MAX).Wait(),
            "both library calls": both,
            "auto": lambda: C.reduce_scatter(x, comm=comm, op="sum", algorithm=algorithm, out=out),
            "look-up": look_up, "fast form": lambda: fast(x, out),
            "check": check, "statistics": statistics, "loop": _nothing,
            "empty call": lambda: _scatter_empty(x, comm=comm, op="sum", algorithm=algorithm, out=out),
            "call and tests": lambda: _scatter_tests(x, comm=comm, op="sum", algorithm=algorithm, out=out)}
    steps = ["both library calls", "check", "statistics"]
    derived = {"public entry": ("auto", ["look-up", "fast form"]), "in the fast form": ("fast form", steps),
               "rest": ("auto", ["look-up"] + steps),
               "keyword-only call": ("empty call", []), "call and its tests": ("call and tests", [])}
    den = "MPI_Ireduce_scatter_block+Wait"
    ratios = {f"auto / {den}": ("auto", den), f"both library calls / {den}": ("both library calls", den),
              f"MPI_Iallreduce 16 B+Wait / {den}": ("MPI_Iallreduce 16 B+Wait", den),
              f"{den} / MPI_Reduce_scatter": (den, "MPI_Reduce_scatter")}
    return Rows(rows, lambda: None, derived, ratios, "auto")


#: --op -> row builder.
OPS = {"allreduce": allreduce_rows, "reduce_scatter": scatter_rows}
