"""What a hybrid run reports: memory per rank, per-axis traffic, the pipeline bubble, the summary.

Every rank measures its own numbers (parameters, gradient and optimizer bytes it holds, bytes it
sent on the data, tensor and pipeline axes, seconds it waited on its pipeline neighbours); rank 0
gathers them with one buffer-based ``Gather`` and writes them into ``summary.json``.
"""
import numpy

from training.model_parallel.pipeline import bubble_formula

__all__ = ["rank_memory", "gather_ranks", "summarize"]


def rank_memory(t):
    """Return this rank's parameter count and bytes of parameters, gradients and optimizer state."""
    opt_bytes = sum(int(v.nbytes) for v in t.opt.state_dict().values())
    return {"parameters": t.model.size, "param_bytes": int(t.model.params.nbytes),
            "grad_bytes": int(t.model.grads.nbytes), "optimizer_bytes": opt_bytes}


def gather_ranks(t, comm):
    """Return every rank's memory and per-axis traffic (rank 0: a list of dicts; others: None)."""
    mem, a, steps = rank_memory(t), t.axes, max(t.axes["steps"], 1)
    keys = ("d", "t", "q", "parameters", "param_bytes", "grad_bytes", "optimizer_bytes",
            "activation_bytes", "tensor_bytes_per_step", "pipeline_bytes_per_step", "data_bytes_per_step",
            "bubble")
    row = numpy.array([*t.grid.coords(), mem["parameters"], mem["param_bytes"], mem["grad_bytes"],
                       mem["optimizer_bytes"], a["activation_bytes"], a["tensor_bytes"] / steps,
                       a["pipeline_bytes"] / steps, a["data_bytes"] / steps,
                       a["wait_s"] / a["wall_s"] if a["wall_s"] else 0.0], numpy.float64)
    every = numpy.empty((comm.Get_size(), row.size)) if comm.Get_rank() == 0 else None
    comm.Gather(row, every, root=0)
    if comm.Get_rank():
        return None
    return [{k: (float(v) if k in ("bubble",) or k.endswith("_step") else int(v)) for k, v in zip(keys, r)}
            for r in every]


def summarize(cfg, t, comm, run_dir, ranks, train_acc, test_acc, identical):
    """Return the run summary; ``ranks`` is :func:`gather_ranks`' table (None off rank 0)."""
    g, state = t.grid, t.state
    s = {"final_test_acc": test_acc, "final_train_acc": train_acc, "epochs": state.epoch, "steps": state.step,
         "wall_s": state.wall_s, "compute_s": state.compute_s, "comm_s": state.comm_s,
         "skipped_steps": state.skipped, "P": comm.Get_size(), "run_dir": run_dir,
         "replicas_identical": identical,
         "grid": {"data": g.D, "tensor": g.T, "pipeline": g.Q}, "micro_batches": cfg.micro_batches,
         "schedule": cfg.schedule, "widths": t.sizes,
         "parameters": sum(a * b + b for a, b in zip(t.sizes[:-1], t.sizes[1:])),
         "bubble_formula": bubble_formula(g.Q, cfg.micro_batches)}
    if ranks is None:
        s["bubble_measured"] = float("nan")
        return s
    stages = [numpy.mean([r["bubble"] for r in ranks if r["q"] == q]) for q in range(g.Q)]
    s.update({"bubble_measured": float(numpy.mean(stages)) if g.Q > 1 else 0.0,
              "bubble_per_stage": [float(b) for b in stages], "ranks": ranks,
              "bytes_per_rank_per_step": {ax: float(numpy.mean([r[f"{ax}_bytes_per_step"] for r in ranks]))
                                          for ax in ("data", "tensor", "pipeline")},
              "max_param_optimizer_bytes_per_rank": max(r["param_bytes"] + r["optimizer_bytes"] for r in ranks),
              "activation_bytes_per_stage": [max(r["activation_bytes"] for r in ranks if r["q"] == q)
                                             for q in range(g.Q)]})
    return s
