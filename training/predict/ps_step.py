"""One parameter-server step (BSP), from the end of the servers' update to the end of the next.

As :mod:`ps.serving.shard_server` and :mod:`ps.worker.client` run it (ranks ``0 .. S-1`` serve, the W = P - S others work):

1. **replies.** The servers answer the waiting pulls at once (``Isend`` to every worker). The replay
   (:func:`training.predict.message_times.ps_clocks`, requests included) gives each worker's end as if
   each server sent its replies one after another at the full rate, and the last one's end T: a
   link carries the same bytes whatever order it sends them in. Replies that share a link do not end
   one after another but together, more or less: the topology's ``fanout`` (measured by the
   emulator's calibration, :func:`training.emulator.calibrate.fanout`) gives when the k-th of n
   messages a node sends at once ends, as a fraction ``f(k / n)`` of when the last ends; the k-th
   of the n workers a link serves (in the replay's order) gets its reply at
   ``max(its replay end, f(q) T)``, ``q = (k / n) ** (1 / S')``: a worker's reply is the last of its
   pieces from the S' servers on other nodes, each server ordering its replies on its own (the
   expected k-th of n maxima of S' uniform places). Without ``fanout`` ``f = 1``: the replies share
   the link evenly and end together. A worker whose servers are all on its own node (shared memory)
   keeps its replay end.
2. **compute.** Each worker starts its forward and backward pass at its own reply. Workers computing
   at the same time on one host share its ``cores`` (each at ``min(1, cores / busy)`` of a core);
   the servers and the waiting workers sleep (:class:`ps.wire.messages.Backoff`) and take none.
3. **pushes.** Each worker posts its push once computed. A server takes one push at a time, in the
   order they come (probe, then the payload), so each server node's link receives the pushes that
   cross it one after another, first come first served: a push's bytes take the replay's time of all
   of them at once (``ps_clocks``'s push) less one latency, divided by their number, and a push that
   finds the link idle arrives one latency later than its bytes alone; a push over shared memory
   arrives after its own replay time.
4. **update.** Once a server node's pushes are in, its servers update their shard (the optimizer's
   time over S, longer on a host with fewer cores than servers); the step is the last server's.
"""
import numpy

from training.predict import message_times

__all__ = ["ps_step", "reply_ends", "fanout_fractions", "share_cores"]


def fanout_fractions(fanout, nbytes, positions):
    """Return ``f(q)`` at each position q in (0, 1]: when the message at that place in the order of ends
    of messages of ``nbytes`` sent at once ends, as a fraction of the last one's end (ones without ``fanout``).

    ``fanout`` is a topology's list of ``{"bytes", "fractions"}`` (the sorted ends of ``m`` messages sent
    at once as fractions of the last, at positions ``k / m``); between the measured sizes the fractions
    are interpolated in log bytes, beyond them the nearest size's are taken, and between positions
    linearly (before the first, the first).

    Examples
    --------
    >>> fanout_fractions([{"bytes": 1000, "fractions": [0.5, 1.0]}], 1000, [0.25, 0.5, 0.75, 1.0]).tolist()
    [0.5, 0.5, 0.75, 1.0]
    >>> fanout_fractions(None, 1000, [0.5, 1.0]).tolist()
    [1.0, 1.0]
    """
    positions = numpy.asarray(positions, dtype=float)
    if not fanout:
        return numpy.ones(len(positions))
    sizes = numpy.log([float(e["bytes"]) for e in fanout])
    fr = numpy.array([e["fractions"] for e in fanout], dtype=float)  # (sizes, m)
    order = numpy.argsort(sizes)
    sizes, fr = sizes[order], fr[order]
    x = numpy.log(max(float(nbytes), 1.0))
    curve = numpy.array([numpy.interp(x, sizes, fr[:, i]) for i in range(fr.shape[1])])
    m = len(curve)
    return numpy.interp(positions, numpy.arange(1, m + 1) / m, curve)


def share_cores(starts, work, hosts, cores):
    """Return each task's end when tasks on one host share its ``cores`` (processor sharing).

    Parameters
    ----------
    starts, work : array_like, shape (n,)
        Start (s) and length at a whole core (s) of each task.
    hosts : array_like, shape (n,), int
        The host of each task.
    cores : int
        Cores per host; 0: a core per task (each ends at ``start + work``).

    Examples
    --------
    >>> share_cores([0.0, 0.0], [1.0, 1.0], [0, 0], 1).tolist()  # two on one core: both end at 2 s
    [2.0, 2.0]
    >>> share_cores([0.0, 1.0], [2.0, 1.0], [0, 0], 1).tolist()  # alone 1 s, then halves
    [3.0, 3.0]
    """
    starts, left = numpy.asarray(starts, float), numpy.array(work, dtype=float)
    hosts = numpy.asarray(hosts)
    end = starts + left
    if not cores or len(starts) == 0:
        return end
    end = numpy.full(len(starts), numpy.inf)
    end[left <= 0] = starts[left <= 0]
    t = float(starts.min())
    while numpy.isinf(end).any():
        run = (starts <= t) & numpy.isinf(end)
        rate = numpy.zeros(len(starts))
        for h in numpy.unique(hosts[run]):
            on = run & (hosts == h)
            rate[on] = min(1.0, cores / on.sum())
        waiting = numpy.isinf(end) & (starts > t)
        nxt = starts[waiting].min() if waiting.any() else numpy.inf
        with numpy.errstate(divide="ignore"):
            fin = numpy.where(run, t + left / numpy.where(rate > 0, rate, 1.0), numpy.inf)
        t_next = min(nxt, fin.min())
        left[run] -= rate[run] * (t_next - t)
        done = run & (fin <= t_next + 1e-15)
        end[done] = t_next
        left[done] = 0.0
        t = t_next
    return end


def reply_ends(topo, net, servers, pull, nbytes):
    """Return when each worker's reply has arrived, from the replay's pull clocks (shape (P,)) and the
    topology's ``fanout`` (step 1 above; ``nbytes``: the whole gradient, each server's piece
    ``nbytes / servers``).

    Returns
    -------
    ndarray, shape (P - servers,)
        Seconds from the update's end, workers ``servers .. P-1`` in order.
    """
    S = servers
    workers = numpy.arange(S, net.size)
    far = numpy.array([sum(net.node(s) != net.node(int(w)) for s in range(S)) for w in workers])
    reply = pull[S:].copy()
    idx = numpy.flatnonzero(far)
    if len(idx):  # replies over a link end by the measured fan-out, in the replay's order
        order = idx[numpy.argsort(reply[idx], kind="stable")]
        last = max(float(reply[order].max()), float(pull[:S].max()))  # ... or when the servers are done sending
        q = (numpy.arange(1, len(order) + 1) / len(order)) ** (1.0 / far[order])  # the last of its pieces
        f = fanout_fractions(getattr(topo, "fanout", None), nbytes / S, q)
        reply[order] = numpy.maximum(reply[order], f * last)
    return reply


def _pushes(net, servers, push, posted):
    """Per server node, its link takes the pushes one at a time as they come; return ``(arrive (P,),
    done (W,))``: when each server's pushes are all in, when each worker's pushes are."""
    S = servers
    workers = numpy.arange(S, net.size)
    arrive, done = numpy.zeros(net.size), posted.copy()
    lat = net.alpha_node + (net.alpha_rack if net.racks > 1 else 0.0)  # a message's latency between nodes
    for n in sorted({net.node(s) for s in range(S)}):
        mine = [s for s in range(S) if net.node(s) == n]
        over = numpy.array([net.node(int(w)) != n for w in workers])
        near = (posted + push[S:])[~over]  # over shared memory: its own replay time
        t = float(near.max()) if len(near) else 0.0
        done[~over] = numpy.maximum(done[~over], near)
        idx = numpy.flatnonzero(over)
        if len(idx):
            each = max(0.0, float(push[mine].max()) - lat) / len(idx)  # the link's time per push's bytes
            q = 0.0
            for k in idx[numpy.argsort(posted[idx], kind="stable")]:  # first come, first served
                q = max(q, posted[k] + lat) + each
                done[k] = max(done[k], q)
            t = max(t, q)
        arrive[mine] = t
    return arrive, done


def ps_step(profile, topo, net, cfg, work):
    """Replay one BSP step of ``cfg.servers`` servers; return ``(step_s, parts)`` (per-rank arrays).

    ``work`` is a worker's forward and backward seconds at a whole core (the profile's, scaled to its
    rows and the topology's ``compute_scale``). ``parts``: ``compute``, ``comm``, ``wait`` (shape (P,)),
    adding up to the step on every rank.
    """
    P, S = net.size, cfg.servers
    nbytes = profile.elements * profile.itemsize
    push, pull = message_times.ps_clocks(net, S, nbytes, profile.itemsize)
    reply = reply_ends(topo, net, S, pull, nbytes)
    per_host = net.ranks_per_host or net.ranks_per_node
    hosts = numpy.arange(S, P) // per_host
    posted = share_cores(reply, numpy.full(P - S, work), hosts, net.cores if net.oversubscription > 1 else 0)
    arrive, done = _pushes(net, S, push, posted)
    busy = min(S, per_host)  # the servers updating at once on a host
    update = profile.optimizer_s * topo.compute_scale * (max(1.0, busy / net.cores) if net.cores else 1.0) / S
    step = float(arrive[:S].max()) + update
    parts = {k: numpy.zeros(P) for k in ("compute", "comm", "wait")}
    parts["compute"][S:] = posted - reply
    parts["comm"][S:] = reply + done - posted
    parts["compute"][:S] = update
    parts["comm"][:S] = numpy.minimum(pull[:S] + numpy.maximum(0.0, arrive[:S] - posted.min()), step - update)
    parts["wait"] = step - parts["compute"] - parts["comm"]
    return step, parts
