"""A step on a data x tensor x pipeline grid (:mod:`training.model_parallel`), replayed per stage.

Rank ``(q D + d) T + t`` (Megatron-LM's order, :mod:`training.model_parallel.grid`). Per micro-batch of
``rows / m`` rows, stage q runs its layers (``stage_layers``): a column- or row-parallel layer, and the
activation after a column-parallel one, take ``1 / T`` of the profiled time; a row-parallel layer's
forward ends with an all-reduce of its output over the tensor group, a column-parallel layer's
backward with one of its input gradient (none for the model's first layer). Activations and their
gradients cross between stages as one message per rank, all of a stage's ranks at once. The stages
follow the GPipe or 1F1B schedule (:func:`training.predict.pipeline_replay.replay_pipeline`); each stage's
gradient (its share of the parameters) is then all-reduced over its data-parallel group of D ranks
in buckets of ``bucket_bytes``, and the optimizer updates the stage's share.
"""
import math

from training.model_parallel.grid import layer_kinds
from training.model_parallel.pipeline import stage_layers
from training.model.nn import Linear, ReLU

from training.predict import message_times
from training.predict.ledger import Ledger, scaled
from training.predict.pipeline_replay import replay_pipeline

__all__ = ["grid_step"]


def _layer_objects(profile):
    return [Linear(layer["n_in"], layer["n_out"]) if layer.get("n_in") else ReLU() for layer in profile.layers]


def grid_step(profile, topo, net, cfg):
    """Return the :class:`Ledger` of one step of ``cfg`` on a T x Q grid (see the module).

    Raises
    ------
    ValueError
        T Q does not divide P, more stages than linear layers, or fewer rows than micro-batches.
    """
    P, T, Q, m = net.size, cfg.tensor_parallel, cfg.pipeline_parallel, cfg.micro_batches
    if P % (T * Q):
        raise ValueError(f"config field 'tensor_parallel': T x Q = {T} x {Q} does not divide P={P}")
    D = P // (T * Q)
    rows = cfg.batch_size / D if cfg.batch_size else profile.rows
    if rows < m:
        raise ValueError(f"config field 'micro_batches': {m} micro-batches of {rows:g} rows per replica")
    objs = _layer_objects(profile)
    try:
        bounds = [stage_layers(objs, Q, q) for q in range(Q)]
    except ValueError as e:
        raise ValueError(f"config field 'pipeline_parallel': {e}") from None
    linear = [i for i, o in enumerate(objs) if isinstance(o, Linear)]
    kinds = dict(zip(linear, layer_kinds(len(linear)))) if T > 1 else {i: "replicated" for i in linear}
    mb = rows / m
    fwd, bwd, xf, xb, cm = scaled(profile, topo, net, mb)
    tnet = message_times.group_network(net, 0, 1, T) if T > 1 else None
    item = profile.itemsize
    F, B, Ftp, Btp, out_w, elems = [], [], [], [], [], []
    split = False
    for q, (lo, hi) in enumerate(bounds):
        f = b = ftp = btp = 0.0
        n = 0
        for i in range(lo, hi):
            kind = kinds.get(i)
            if kind is not None:
                split = kind == "column"
            share = T if (kind in ("column", "row") or (kind is None and split)) else 1
            f, b = f + fwd[i] / share, b + bwd[i] / share
            layer = profile.layers[i]
            if kind == "row":
                ftp += float(message_times.allreduce_clocks(cfg.algorithm, int(mb * layer["n_out"]) * item, tnet,
                                                   None, item).max())
                n += layer["n_in"] * layer["n_out"] // T + layer["n_out"]
            elif kind == "column":
                if i != linear[0]:
                    btp += float(message_times.allreduce_clocks(cfg.algorithm, int(mb * layer["n_in"]) * item, tnet,
                                                       None, item).max())
                n += math.ceil(layer["params"] / T)
            else:
                n += layer["params"]
        if q == 0:
            f += xf
        if q == Q - 1:
            b += xb
        F.append(f)
        B.append(b)
        Ftp.append(ftp)
        Btp.append(btp)
        out_w.append(profile.layers[max(i for i in range(lo, hi) if i in kinds)]["n_out"])
        elems.append(n)
    msg = []
    for q in range(Q - 1):
        pairs = [(r, r + D * T) for r in range(q * D * T, (q + 1) * D * T)]
        msg.append(float(message_times.send_clocks(net, pairs, int(mb * out_w[q]) * item).max()))
    end, busy = replay_pipeline(cfg.schedule, [f + t for f, t in zip(F, Ftp)], [b + t for b, t in zip(B, Btp)],
                                msg, msg, m)
    led = Ledger(P, cm)
    total = sum(layer["params"] for layer in profile.layers) or 1
    finish = []
    for q in range(Q):
        dp = 0.0
        if D > 1:
            dnet = message_times.group_network(net, q * D * T, T, D)
            nbytes = elems[q] * item
            size = cfg.bucket_bytes or nbytes
            for k in range(math.ceil(nbytes / size)):
                part = min(size, nbytes - k * size)
                dp += float(message_times.allreduce_clocks(cfg.algorithm, part, dnet, cfg.grid if cfg.grid == "topology" else None,
                                                  item).max())
        opt = profile.optimizer_s * cm * elems[q] / total
        ranks = slice(q * D * T, (q + 1) * D * T)
        led.parts["compute"][ranks] = m * (F[q] + B[q]) + opt
        led.parts["comm"][ranks] = m * (Ftp[q] + Btp[q]) + dp
        led.parts["bubble"][ranks] = end[q] - busy[q]
        finish.append(end[q] + dp + opt)
    led.t = max(finish)
    parts = led.parts
    parts["wait"] = led.t - parts["compute"] - parts["comm"] - parts["bubble"]
    return led
