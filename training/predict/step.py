"""Replay one training step on every rank: compute from the profile, messages from the network model.

Data-parallel (``mode="dp"``, T = Q = 1), as :func:`training.dp.data_parallel.train_step` runs it:

1. forward, then backward layer by layer (the profile's times, scaled by rows per rank, the
   topology's ``compute_scale`` and the host's oversubscription);
2. the non-finite flag's all-reduce (4 bytes, ``recursive_doubling``);
3. the gradient: buckets (:func:`training.dp.hooks.bucket_bounds`, last layer first) all-reduced one
   after another; with ``overlap`` each bucket starts once the backward pass has written it. With
   ``progress="tests"`` (commlab's executor, no progress thread) a started bucket advances one round
   per test, and tests happen between layers: each round lasts the bucket's replayed time divided by
   its rounds, and whatever is left runs after the backward pass. With ``"continuous"`` a bucket runs
   on its own from its start, after the previous one (a progress engine's stream);
   a compressor instead compresses the whole gradient, moves its payloads by its transport (all-reduce,
   adding in the payload's dtype at the profile's speed for it; ring all-gather, after the element
   counts' all-gather for an all-gather-v; or PowerSGD's one all-reduce per payload) and decompresses
   (an all-gather's decompression repeated for each of the P payloads);
4. the optimizer.

Parameter server (``mode="ps"``, :mod:`training.predict.ps_step`): from one update's end, the
servers' replies (ending by the topology's measured fan-out), each worker's compute from its own
reply (workers on one host sharing its cores), the pushes taken one at a time as they come, the
update (the optimizer's time over S).

Grid (T x Q > 1, rank ``(q D + d) T + t`` as :mod:`training.model_parallel.grid`): layers split over
the T ranks of a tensor group (column/row pairs, compute / T, an all-reduce of the activations
forward and of the input gradient backward per pair); Q stages (``stage_layers``) run m
micro-batches by the GPipe or 1F1B schedule, activations sent between stages; then each stage's
gradient is all-reduced over its data-parallel group and the optimizer runs.

Per rank: ``compute`` (own work, codecs included), ``comm`` (exposed communication: time in messages
not hidden behind compute), ``bubble`` (pipeline idle time), ``wait`` (for slower ranks); they add up
to the step time, the same on every rank of a synchronous step.
"""
from dataclasses import replace

import numpy

from training.dp.hooks import bucket_bounds

from training.predict import message_times
from training.predict.grid_step import grid_step
from training.predict.ledger import Ledger, scaled
from training.predict.profile import find_codec
from training.predict.ps_step import ps_step

__all__ = ["predict", "FLAG_ALGORITHM"]

#: The non-finite flag's all-reduce (training.dp.data_parallel.CONTROL_ALGORITHM).
FLAG_ALGORITHM = "recursive_doubling"
_DEFAULT_GAMMA = 1 / 4e9


def _flag(net):
    return message_times.allreduce_clocks(FLAG_ALGORITHM, 4, net)


def _ready_times(profile, buckets, start, bwd):
    """Time each bucket becomes complete in the backward pass starting at ``start`` (overlap.py's rule)."""
    ready, low, t, k = [None] * len(buckets), profile.elements, start, 0
    ends = []
    for i in range(len(profile.layers) - 1, -1, -1):
        t += bwd[i]
        ends.append(t)
        if profile.layers[i]["params"]:
            low = min(low, profile.layers[i]["offset"])
        while k < len(buckets) and buckets[k][0] >= low:
            ready[k] = t
            k += 1
    return [r if r is not None else t for r in ready], ends


def _overlap(led, cfg, net, buckets, ready, tests, itemsize, end_backward):
    """Bucketed all-reduce started during the backward pass; returns when the last bucket is done."""
    P = net.size
    clocks = [message_times.allreduce_clocks(cfg.algorithm, (hi - lo) * itemsize, net, cfg.grid, itemsize)
              for lo, hi in buckets]
    durs = [float(c.max()) for c in clocks]
    if cfg.progress == "continuous":
        end = 0.0
        for r, d in zip(ready, durs):
            end = max(end, r) + d
        end = max(end, end_backward + float(_flag(net).max()))
    else:
        rounds = [max(1, message_times.allreduce_rounds(cfg.algorithm, P, (hi - lo) * itemsize, cfg.grid, itemsize, net))
                  for lo, hi in buckets]
        step = [d / n for d, n in zip(durs, rounds)]
        done, posted = [0] * len(buckets), [None] * len(buckets)
        for t in tests:  # a test point: start the buckets complete by now, then test every bucket in flight
            for k in range(len(buckets)):
                if posted[k] is None and ready[k] <= t:
                    posted[k] = t
                elif posted[k] is not None and done[k] < rounds[k] and posted[k] + step[k] <= t:
                    done[k] += 1  # its round is over: the next one is posted now (none after the last)
                    posted[k] = t
        end = end_backward + float(_flag(net).max())
        for k in range(len(buckets)):
            if done[k] == rounds[k]:
                continue
            if posted[k] is None:
                posted[k] = end_backward
            left = rounds[k] - done[k]
            end = max(end, posted[k] + step[k]) + (left - 1) * step[k]
    exposed = max(0.0, end - end_backward)
    last = clocks[-1]
    slack = numpy.minimum(float(last.max()) - last, exposed)
    led.t += exposed
    led.parts["comm"] += exposed - slack
    led.parts["wait"] += slack


def _compressed(led, cfg, profile, net):
    codec = find_codec(profile, cfg.compression, cfg.compression_args)  # this setting's payloads, not the name's
    cm = led.cm
    led.compute(codec["compress_s"] * cm)
    if codec["transport"] in ("allgather", "allgatherv"):
        if codec["transport"] == "allgatherv":  # the payloads' element counts go first (int64 each)
            led.collective(message_times.allgather_clocks(8 * len(codec["payload_bytes"]), net))
        led.collective(message_times.allgather_clocks(int(sum(codec["payload_bytes"])), net))
        led.compute(codec["decompress_s"] * cm * net.size)
    else:
        if codec.get("reduce_s_per_byte") and profile.reduce_s_per_byte:  # adds in the payload's own dtype
            net = replace(net, gamma=net.gamma * codec["reduce_s_per_byte"] / profile.reduce_s_per_byte)
        for nb in codec["payload_bytes"]:
            led.collective(message_times.allreduce_clocks(cfg.algorithm, int(nb), net, cfg.grid, itemsize=1))
        led.compute(codec["decompress_s"] * cm)


def _dp_step(profile, topo, net, cfg):
    P = net.size
    rows = cfg.batch_size / P if cfg.batch_size else profile.rows
    fwd, bwd, xf, xb, cm = scaled(profile, topo, net, rows)
    led = Ledger(P, cm)
    led.compute(float(fwd.sum()) + xf + xb)
    start_bwd = led.t
    led.compute(float(bwd.sum()))
    itemsize = profile.itemsize
    if cfg.compression != "none":
        led.collective(_flag(net))
        _compressed(led, cfg, profile, net)
    elif cfg.overlap:
        buckets = bucket_bounds(profile.slices(), itemsize, cfg.bucket_bytes)
        ready, tests = _ready_times(profile, buckets, start_bwd, bwd)
        _overlap(led, cfg, net, buckets, ready, tests, itemsize, led.t)
    else:
        led.collective(_flag(net))
        for lo, hi in bucket_bounds(profile.slices(), itemsize, cfg.bucket_bytes):
            led.collective(message_times.allreduce_clocks(cfg.algorithm, (hi - lo) * itemsize, net, cfg.grid, itemsize))
    led.compute(profile.optimizer_s * cm)
    return led


def _ps_step(profile, topo, net, cfg):
    P, S = net.size, cfg.servers
    if S >= P:
        raise ValueError(f"config field 'servers': {S} servers leave no worker among P={P} ranks")
    rows = cfg.batch_size / (P - S) if cfg.batch_size else profile.rows
    fwd, bwd, xf, xb, _ = scaled(profile, topo, net, rows)
    work = (float(fwd.sum() + bwd.sum()) + xf + xb) / net.oversubscription  # at a whole core
    step, parts = ps_step(profile, topo, net, cfg, work)
    led = Ledger(P)
    led.t = step
    led.parts.update(parts)
    return led


def predict(profile, topo, cfg):
    """Predict one step of ``cfg`` for the job of ``profile`` on ``topo``.

    Parameters
    ----------
    profile : training.predict.profile.Profile
    topo : training.predict.topology.Topology
    cfg : training.predict.job_config.JobConfig

    Returns
    -------
    dict
        ``step_s`` (seconds), ``P``, ``config`` (label), ``breakdown`` (mean seconds over ranks of
        ``compute``, ``comm``, ``bubble``, ``wait``) and ``ranks``: classes of ranks with the same
        breakdown, each ``{"ranks": "a-b,...", "compute", "comm", "bubble", "wait"}``.

    Raises
    ------
    ValueError
        A configuration that does not fit the topology or the profile, naming the field.
    """
    net = topo.with_gamma(profile.reduce_s_per_byte or _DEFAULT_GAMMA)
    P = net.size
    if cfg.mode == "ps":
        led = _ps_step(profile, topo, net, cfg)
    elif cfg.tensor_parallel * cfg.pipeline_parallel > 1:
        led = grid_step(profile, topo, net, cfg)
    else:
        if cfg.algorithm in ("2d", "torus") and cfg.grid not in (None, "topology"):
            if int(numpy.prod(cfg.grid)) != P:
                raise ValueError(f"config field 'grid': {list(cfg.grid)} has {int(numpy.prod(cfg.grid))} ranks, "
                                 f"the topology {P}")
        led = _dp_step(profile, topo, net, cfg)
    return _report(led, cfg, P)


def _report(led, cfg, P):
    parts = led.parts
    step = float(max(led.t, (parts["compute"] + parts["comm"] + parts["bubble"] + parts["wait"]).max()))
    parts["wait"] += step - (parts["compute"] + parts["comm"] + parts["bubble"] + parts["wait"])
    keys = ("compute", "comm", "bubble", "wait")
    table = numpy.round(numpy.stack([parts[k] for k in keys], axis=1), 9)  # (P, 4)
    classes = {}
    for r in range(P):
        classes.setdefault(tuple(table[r]), []).append(r)
    ranks = [{"ranks": _ranges(rs), **{k: float(v) for k, v in zip(keys, row)}} for row, rs in
             sorted(classes.items(), key=lambda kv: kv[1][0])]
    return {"config": cfg.label(), "P": P, "step_s": step,
            "breakdown": {k: float(parts[k].mean()) for k in keys}, "ranks": ranks}


def _ranges(rs):
    out, start = [], rs[0]
    for a, b in zip(rs, rs[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)
