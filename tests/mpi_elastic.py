"""Elastic training's bitwise oracle (run under ``mpiexec --with-ft ulfm -n 4``, Open MPI with ULFM).

``python -m tests.mpi_elastic VARIANT VICTIM STEP WHERE [respawn]``: VARIANT is ``plain``, ``bucketed``,
``overlap`` or ``compressed`` (top-k with error feedback); rank VICTIM dies by SIGKILL once STEP
steps are complete, at the start of the next step (``WHERE = step``) or inside its gradient
all-reduce, after posting the first round (``WHERE = inside``).

First the oracle: all ranks train STEP steps (:func:`training.driver.elastic.elastic_loop`), each copies its
state as a checkpoint would hold it, and the ranks but VICTIM restore it into a trainer built on
their own communicator, as ``--resume`` does, and train to the end with the re-partition rule.
Then the same training from the start, VICTIM killed: every survivor must end with bitwise the
oracle's parameters, the replicas identical, the death recorded once (VICTIM, STEP). Prints
``elastic VARIANT WHERE: ok`` (or the failures) from the lowest survivor.

With ``respawn`` (``--elastic-respawn``) a replacement joins at the step the survivors went back to;
the oracle is then the 4-rank job resumed at that step with VICTIM's place last and its error
feedback new, as the replacement's (it takes the parameters, optimizer and compressor state from
rank 0); the replacement runs this module too and takes part in the verdict. With ``respawn-fails``
the replacement cannot start (``MPI_Comm_spawn`` of a program that does not exist): the survivors
must end as without ``--elastic-respawn``.
"""
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import collectives.engine.context
import collectives.engine.executor as executor
from collectives.engine.failures import finalize_within, last_barrier
import training.driver.elastic as elastic
from training.runtime.build import to_device
from training.settings.cli import parse_args
from training.dp.data_parallel import replicas_identical
from training.driver.trainer import build_trainer

TINY = ["--data", "synthetic", "--samples", "300", "--features", "8", "--classes", "3", "--hidden", "16",
        "--batch-size", "32", "--epochs", "2", "--no-progress", "--elastic", "--algorithm", "ring",
        "--optimizer", "sgd", "--lr", "0.05"]
VARIANTS = {"plain": [], "bucketed": ["--bucket-bytes", "64"], "overlap": ["--bucket-bytes", "64", "--overlap"],
            "compressed": ["--compression", "topk", "--compression-arg", "ratio=0.25"]}


def _arm(t, victim, step, where):
    """Make this rank die once ``t.state.step == step``, as ``where`` says (it is ``victim``)."""
    def die():
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "step":
        original = elastic.train_step

        def step_then_die(*args, **kw):
            if t.state.step == step:
                die()
            return original(*args, **kw)
        elastic.train_step = step_then_die
    else:
        post = executor.Run.post

        def post_then_die(self, index):
            out = post(self, index)
            if t.state.step == step and self.work.size > 8:  # the gradient's (not the skip flag's) exchange
                die()
            return out
        executor.Run.post = post_then_die


def main():
    variant, victim, step, where = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    respawn = len(sys.argv) > 5 and sys.argv[5] == "respawn"
    no_start = len(sys.argv) > 5 and sys.argv[5] == "respawn-fails"  # the replacement cannot start
    cfg = parse_args(TINY + VARIANTS[variant] + (["--elastic-respawn"] if respawn or no_start else []))
    world = MPI.COMM_WORLD
    if MPI.Comm.Get_parent() != MPI.COMM_NULL:  # the replacement of VICTIM: it joins the killed run
        run3, _ = elastic.join_loop(cfg, MPI.Comm.Get_parent(), records=False)
        return _verdict(run3, variant, where, [], respawn)
    # the oracle: STEP steps on every rank, then the survivors resumed from the copy
    comm = world.Dup()
    t = build_trainer(cfg, comm)
    data = to_device(t.ds, t.model.dtype, t.xp)
    run = elastic.elastic_loop(cfg, comm, t, data, elastic.Position(world.size), stop_step=step)
    saved = elastic.snapshot(t, run.pos)  # what a checkpoint of step STEP holds, this rank's error feedback included
    t.hook.close()
    oracle = None
    if respawn:  # the P-rank job resumed at that step, VICTIM last and its error feedback new, as a replacement's
        sub = run.comm.Split(0, world.size if world.rank == victim else world.rank)
        if world.rank == victim and saved["hook"]:
            saved["hook"]["memory"] = None
    else:
        sub = run.comm.Split(0 if world.rank != victim else MPI.UNDEFINED, world.rank)
    if world.rank != victim or respawn:
        t2 = build_trainer(cfg, sub)
        pos = elastic.restore_snapshot(t2, saved)
        elastic.elastic_loop(cfg, sub, t2, data, pos)
        oracle = np.array(t2.model.params, copy=True)
        t2.hook.close()
    world.Barrier()
    # the same job from the start, VICTIM killed after STEP steps
    if no_start:
        sys.executable = "/nonexistent/python"  # MPI_Comm_spawn fails: the survivors must go on alone
    comm = world.Dup()
    t3 = build_trainer(cfg, comm)
    if world.rank == victim:
        _arm(t3, victim, step, where)
    run3 = elastic.elastic_loop(cfg, comm, t3, data, elastic.Position(world.size))
    run3.t = t3
    fails = []
    if not np.array_equal(t3.model.params, oracle):
        fails.append(f"parameters differ from the oracle's (max |diff| {np.abs(t3.model.params - oracle).max():.3g})")
    lost = [(d["ranks"], d["step"]) for d in run3.lost]
    if lost != [([victim], step)]:
        fails.append(f"deaths recorded {lost}, expected [([{victim}], {step})]")
    joined = [(d["ranks"], d["step"]) for d in run3.joined]
    if respawn and joined != [([world.size], step)]:
        fails.append(f"joins recorded {joined}, expected [([{world.size}], {step})]")
    if no_start and not (len(run3.joined) == 1 and run3.joined[0]["ranks"] == [] and run3.joined[0].get("error")):
        fails.append(f"a failed start recorded as {run3.joined}")
    if run3.comm.size != world.size - (not respawn):
        fails.append(f"{run3.comm.size} ranks at the end")
    return _verdict(run3, variant, where, fails, respawn)


def _verdict(run, variant, where, fails, respawn):
    """Agree over the run's ranks (replacements included) on the failures; print the verdict; return the status."""
    if not replicas_identical(run.t.model.params, run.comm):
        fails.append("the replicas differ")
    for f in fails:
        print(f"rank {run.comm.rank}: elastic {variant} {where}: FAIL {f}", flush=True)
    flag = np.array([len(fails)], np.int32)
    run.comm.Allreduce(MPI.IN_PLACE, flag)
    name = f"elastic {variant} {where}" + (f" {sys.argv[5]}" if len(sys.argv) > 5 else "")
    if run.comm.rank == 0:
        print(f"{name}: {'ok' if not flag[0] else 'FAILED'} (steps redone {run.redone})", flush=True)
    if respawn:  # a job joined to a replacement finalizes with it, its communicator freed (as the trainer's)
        collectives.engine.context.free_context(run.comm)
        run.t.hook.close()
        run.comm.Free()
    else:
        last_barrier(run.comm)  # no rank leaves without MPI_Finalize while a peer is in the verdict's call
    return int(flag[0] > 0)


if __name__ == "__main__":
    status = main()
    if len(sys.argv) > 5 and sys.argv[5] == "respawn":
        finalize_within(elastic.FINALIZE_S, status)  # MPI_Finalize now, as training.driver.elastic.leave: the fence may hang
        sys.exit(status)
    sys.stdout.flush()
    os._exit(status)  # as training.driver.elastic.leave: MPI_Finalize could wait for the dead rank
