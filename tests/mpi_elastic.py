"""Elastic training's bitwise oracle (run under ``mpiexec --with-ft ulfm -n 4``, Open MPI with ULFM).

``python -m tests.mpi_elastic VARIANT VICTIM STEP WHERE``: VARIANT is ``plain``, ``bucketed``,
``overlap`` or ``compressed`` (top-k with error feedback); rank VICTIM dies by SIGKILL once STEP
steps are complete, at the start of the next step (``WHERE = step``) or inside its gradient
all-reduce, after posting the first round (``WHERE = inside``).

First the oracle: all ranks train STEP steps (:func:`training.elastic.elastic_loop`), each copies its
state as a checkpoint would hold it, and the ranks but VICTIM restore it into a trainer built on
their own communicator, as ``--resume`` does, and train to the end with the re-partition rule.
Then the same training from the start, VICTIM killed: every survivor must end with bitwise the
oracle's parameters, the replicas identical, the death recorded once (VICTIM, STEP). Prints
``elastic VARIANT: ok`` (or the failures) from the lowest survivor.
"""
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import collectives.engine.executor as executor
import training.elastic as elastic
from training.build import to_device
from training.cli import parse_args
from training.trainer import build_trainer

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
    cfg = parse_args(TINY + VARIANTS[variant])
    world = MPI.COMM_WORLD
    # the oracle: STEP steps on every rank, then the survivors resumed from the copy
    comm = world.Dup()
    t = build_trainer(cfg, comm)
    data = to_device(t.ds, t.model.dtype, t.xp)
    run = elastic.elastic_loop(cfg, comm, t, data, elastic.Position(world.size), stop_step=step)
    saved = elastic.snapshot(t, run.pos)  # what a checkpoint of step STEP holds, this rank's error feedback included
    t.hook.close()
    sub = run.comm.Split(0 if world.rank != victim else MPI.UNDEFINED, world.rank)
    oracle = None
    if world.rank != victim:
        t2 = build_trainer(cfg, sub)
        pos = elastic.restore_snapshot(t2, saved)
        elastic.elastic_loop(cfg, sub, t2, data, pos)
        oracle = np.array(t2.model.params, copy=True)
        t2.hook.close()
    world.Barrier()
    # the same job from the start, VICTIM killed after STEP steps
    comm = world.Dup()
    t3 = build_trainer(cfg, comm)
    if world.rank == victim:
        _arm(t3, victim, step, where)
    run3 = elastic.elastic_loop(cfg, comm, t3, data, elastic.Position(world.size))
    fails = []
    if not np.array_equal(t3.model.params, oracle):
        fails.append(f"parameters differ from the oracle's (max |diff| {np.abs(t3.model.params - oracle).max():.3g})")
    lost = [(d["ranks"], d["step"]) for d in run3.lost]
    if lost != [([victim], step)]:
        fails.append(f"deaths recorded {lost}, expected [([{victim}], {step})]")
    if run3.comm.size != world.size - 1:
        fails.append(f"{run3.comm.size} ranks at the end")
    for f in fails:
        print(f"rank {world.rank}: elastic {variant} {where}: FAIL {f}", flush=True)
    flag = np.array([len(fails)], np.int32)
    run3.comm.Allreduce(MPI.IN_PLACE, flag)
    if run3.comm.rank == 0:
        print(f"elastic {variant} {where}: {'ok' if not flag[0] else 'FAILED'} (steps redone {run3.redone})",
              flush=True)
    return int(flag[0] > 0)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    os._exit(status)
