"""Pipeline parallelism: one stage of consecutive layers, micro-batches, GPipe and 1F1B schedules.

The layers of a model are cut into Q consecutive stages (:func:`stage_layers`), one per rank of a
pipeline group. A step splits the rank's batch into m micro-batches; activations go forward to the
next stage and their gradients back to the previous one as point-to-point messages (buffer-based
``Isend`` / ``Irecv`` on a duplicated communicator, every wait under the caller's deadline).
The parameter gradients of the micro-batches are accumulated, weighted by micro-batch size, so
the step's gradient is the gradient of the whole batch's mean loss.

Schedules (lists of ``("F", i)`` / ``("B", i)`` operations per stage, :func:`schedule`):

- ``gpipe`` (Huang et al., "GPipe", NeurIPS 2019, section 2.2): all m forwards, then all m
  backwards; a stage keeps the activations of all m micro-batches.
- ``1f1b`` (Narayanan et al., "PipeDream", SOSP 2019, and the flush variant PipeDream-Flush,
  Narayanan et al. ICML 2021, section 3.1): stage s runs ``min(Q - s - 1, m)`` warm-up forwards,
  then alternates one forward and one backward, then drains the backwards; at most ``Q - s``
  micro-batches are in flight, so activation memory is bounded by Q, not m.

Both have the same bubble, ``(Q - 1) / (m + Q - 1)`` of a stage's time with equal stage costs
(GPipe, section 2.2). Each in-flight micro-batch gets its own *slot*: shallow copies of the stage's
layers sharing the parameter and gradient views but holding their own activation buffers, so
activation memory is measured, not assumed.
"""
import copy
import time

from mpi4py import MPI

from collectives.engine.waiting import Where, deadline_of, wait_all
from training.model.nn import Linear, SoftmaxCrossEntropy
from commlab.arrays import get_array_module
from training.model_parallel.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["SCHEDULES", "schedule", "stage_layers", "simulate_bubble", "bubble_formula", "PipelineStage"]

SCHEDULES = ("gpipe", "1f1b")


def bubble_formula(stages, micro_batches):
    """Return ``(Q - 1) / (m + Q - 1)``, the idle fraction of a stage (Huang et al. 2019, 2.2)."""
    return (stages - 1) / (micro_batches + stages - 1)


def schedule(name, stage, stages, micro_batches):
    """Return stage ``stage``'s operations, a list of ``("F", i)`` and ``("B", i)``.

    Parameters
    ----------
    name : {"gpipe", "1f1b"}
    stage, stages : int
        This stage's index and the number of stages Q.
    micro_batches : int
        m, >= 1.

    Raises
    ------
    ValueError
        For an unknown schedule name.
    """
    m = micro_batches
    if name == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if name != "1f1b":
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}")
    warm = min(stages - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def simulate_bubble(name, stages, micro_batches, t_forward=1.0, t_backward=2.0):
    """Replay the schedule with fixed costs and free messages; return a stage's idle fraction.

    An operation starts when its stage is free and its input exists (the previous stage's forward
    of the same micro-batch, the next stage's backward). Returns ``1 - m (t_f + t_b) / makespan``,
    the same for every stage, which equals :func:`bubble_formula` for both schedules.

    Raises
    ------
    RuntimeError
        When the schedule deadlocks (no stage can start its next operation).
    """
    ops = [schedule(name, s, stages, micro_batches) for s in range(stages)]
    done, free, pos = {}, [0.0] * stages, [0] * stages
    while any(pos[s] < len(ops[s]) for s in range(stages)):
        before = sum(pos)
        for s in range(stages):
            if pos[s] == len(ops[s]):
                continue
            kind, i = ops[s][pos[s]]
            dep = ("F", s - 1, i) if kind == "F" else (("B", s + 1, i) if s < stages - 1 else ("F", s, i))
            if (kind == "F" and s == 0) or dep in done:
                start = max(free[s], done.get(dep, 0.0))
                free[s] = done[(kind, s, i)] = start + (t_forward if kind == "F" else t_backward)
                pos[s] += 1
        if sum(pos) == before:
            raise RuntimeError(f"schedule {name!r} deadlocks at positions {pos}")
    return 1 - micro_batches * (t_forward + t_backward) / max(free)


def stage_layers(layers, stages, stage):
    """Return the ``[lo, hi)`` range of ``layers`` held by ``stage``.

    The linear layers are cut into ``stages`` contiguous groups, each of at least one layer, that
    minimize the largest group's parameter count (``n_in n_out + n_out`` per layer; ties go to
    the earliest cut), so memory per stage falls as 1 / Q as far as whole layers allow. Each
    linear layer takes the activation layers that follow it.

    Raises
    ------
    ValueError
        When there are more stages than linear layers.
    """
    starts = [k for k, layer in enumerate(layers) if _is_linear(layer)]
    if stages > len(starts):
        raise ValueError(f"{stages} pipeline stages for {len(starts)} linear layers: every stage needs at "
                         f"least one (--pipeline-parallel <= number of hidden layers + 1)")
    weights = [layers[k].n_in * layers[k].n_out + layers[k].n_out for k in starts]
    first = _partition(weights, stages)
    lo = starts[first[stage]]
    hi = starts[first[stage + 1]] if stage + 1 < stages else len(layers)
    return lo, hi


def _partition(weights, parts):
    """Return the ``parts + 1`` cut indices of ``weights`` minimizing the largest part's sum."""
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    best = {(0, 0): (0, None)}  # (layers used, parts used) -> (largest part, previous cut)
    for j in range(1, parts + 1):
        for i in range(j, n - (parts - j) + 1):
            options = [(max(best[(h, j - 1)][0], prefix[i] - prefix[h]), h)
                       for h in range(j - 1, i) if (h, j - 1) in best]
            best[(i, j)] = min(options)
    cuts, i = [n], n
    for j in range(parts, 0, -1):
        i = best[(i, j)][1]
        cuts.append(i)
    return cuts[::-1]


def _sync(buf):
    """Wait for the device work that writes ``buf`` before MPI reads it (CUDA-aware MPI, CuPy)."""
    xp = get_array_module(buf)
    if xp.__name__ == "cupy":
        xp.cuda.get_current_stream().synchronize()


def _is_linear(layer):
    return isinstance(layer, (Linear, ColumnParallelLinear, RowParallelLinear))


def _in_width(layer):
    return layer.hi - layer.lo if isinstance(layer, RowParallelLinear) else layer.n_in


def _out_width(layers):
    last = [layer for layer in layers if _is_linear(layer)][-1]
    return last.hi - last.lo if isinstance(last, ColumnParallelLinear) else last.n_out


class PipelineStage:
    """This rank's stage: its layers (views into ``model``'s flat buffers) and the schedules.

    Parameters
    ----------
    model : training.model.nn.Sequential
        The stage's layers only; its flat ``grads`` receive the step's accumulated gradient.
    comm : mpi4py.MPI.Comm
        The pipeline group, rank = stage index (duplicated here for the stage's messages).
    timeout : float, optional
        Seconds any receive or send may wait for the neighbour stage.
    """

    def __init__(self, model, comm, timeout=None):
        self.model, self.comm = model, comm.Dup()
        self.stage, self.stages, self.timeout = comm.Get_rank(), comm.Get_size(), timeout
        self.in_width, self.out_width = _in_width(model.layers[0]), _out_width(model.layers)
        self.slots, self.bytes_sent, self._acc = [], 0, None

    def free(self):
        """Free the stage's duplicated communicator."""
        self.comm.Free()

    def activation_bytes(self):
        """Return the bytes of every slot's activation and activation-gradient buffers (peak held)."""
        total = 0
        for slot in self.slots:
            for layer in slot["layers"] + [slot["loss"]]:
                total += sum(b.nbytes for b in layer.__dict__.get("_bufs", {}).values())
            total += sum(b.nbytes for b in slot["recv"].values())
        return total

    def _slot(self):
        for slot in self.slots:
            if slot["mb"] is None:  # its buffers are ours again once its sends are done
                wait_all(slot["sends"], [None] * len(slot["sends"]), deadline_of(self.timeout), Where("pipeline send", 0, "slot reuse", self.timeout))
                slot["sends"] = []
                return slot
        layers = []
        for layer in self.model.layers:
            c = copy.copy(layer)  # shares parameter and gradient views, not activations
            c.__dict__["_bufs"] = {}
            layers.append(c)
        slot = {"layers": layers, "loss": SoftmaxCrossEntropy(), "recv": {}, "sends": [], "mb": None}
        self.slots.append(slot)
        return slot

    def _recv(self, slot, key, rows, width, src, tag):
        buf = slot["recv"].get(key)
        if buf is None or buf.shape != (rows, width):
            buf = slot["recv"][key] = get_array_module(self.model.params).empty((rows, width), self.model.dtype)
        req, status = self.comm.Irecv(buf, source=src, tag=tag), MPI.Status()
        wait_all([req], [src], deadline_of(self.timeout), Where("pipeline receive", tag // 2, "forward" if tag % 2 == 0 else "backward", self.timeout), statuses=[status])
        if status.Get_count(MPI.BYTE) != buf.nbytes:  # a larger message fails in MPI itself
            raise RuntimeError(f"pipeline stage {self.stage}: stage {src} sent {status.Get_count(MPI.BYTE)} "
                               f"bytes for micro-batch {tag // 2}, expected {buf.nbytes}")
        return buf

    def _send(self, slot, buf, dest, tag):
        _sync(buf)
        slot["sends"].append(self.comm.Isend(buf, dest=dest, tag=tag))
        self.bytes_sent += buf.nbytes

    def step(self, x, y, micro_batches, name="1f1b"):
        """Run forward and backward of one batch over the pipeline; write the gradient into ``model.grads``.

        Parameters
        ----------
        x : ndarray, shape (B, F), model dtype
            The batch (read by stage 0 only; other stages may pass ``None``).
        y : ndarray, shape (B,), int64
            Labels (read by the last stage only). Only ``len(y)`` is used elsewhere.
        micro_batches : int
            m, ``1 <= m <= B``; micro-batch i holds the rows of ``numpy.array_split``'s part i.
        name : {"gpipe", "1f1b"}

        Returns
        -------
        dict
            ``loss`` (mean over the batch; NaN on stages other than the last), ``wall_s``,
            ``wait_s`` (seconds blocked on neighbours), ``bubble`` (wait_s / wall_s),
            ``bytes_sent`` (bytes this rank sent to its neighbours), ``activation_bytes``.
        """
        B, m = len(y), micro_batches
        if not 1 <= m <= B:
            raise ValueError(f"micro_batches must be in [1, {B}] for a batch of {B}, got {m}")
        bounds = [(i * (B // m) + min(i, B % m), (i + 1) * (B // m) + min(i + 1, B % m)) for i in range(m)]
        first, last = self.stage == 0, self.stage == self.stages - 1
        xp = get_array_module(self.model.params)
        if self._acc is None:
            self._acc = xp.zeros_like(self.model.grads)
        acc = self._acc
        acc.fill(0)
        loss, wait, sent0 = 0.0, 0.0, self.bytes_sent
        t0 = time.perf_counter()
        active = {}
        for kind, i in schedule(name, self.stage, self.stages, m):
            lo, hi = bounds[i]
            if kind == "F":
                slot = active[i] = self._slot()
                slot["mb"] = i
                w0 = time.perf_counter()
                h = x[lo:hi] if first else self._recv(slot, "x", hi - lo, self.in_width, self.stage - 1, 2 * i)
                wait += time.perf_counter() - w0
                for layer in slot["layers"]:
                    h = layer.forward(h)
                if last:
                    loss += slot["loss"].forward(h, y[lo:hi]) * (hi - lo) / B
                else:
                    self._send(slot, h, self.stage + 1, 2 * i)
            else:
                slot = active.pop(i)
                w0 = time.perf_counter()
                if last:
                    dy = slot["loss"].backward()
                    dy *= (hi - lo) / B  # micro-batch mean -> its share of the batch mean
                else:  # already scaled by the last stage
                    dy = self._recv(slot, "dy", hi - lo, self.out_width, self.stage + 1, 2 * i + 1)
                wait += time.perf_counter() - w0
                layers = slot["layers"]
                for k in range(len(layers) - 1, -1, -1):
                    dy = layers[k].backward(dy, need_input_grad=k > 0 or not first)
                acc += self.model.grads
                if not first:
                    self._send(slot, dy, self.stage - 1, 2 * i + 1)
                slot["mb"] = None
        w0 = time.perf_counter()
        pending = [r for slot in self.slots for r in slot["sends"]]
        wait_all(pending, [None] * len(pending), deadline_of(self.timeout), Where("pipeline send", 0, "drain", self.timeout))
        for slot in self.slots:
            slot["sends"] = []
        wall = time.perf_counter() - t0
        wait += time.perf_counter() - w0
        self.model.grads[...] = acc
        return {"loss": loss if last else float("nan"), "wall_s": wall, "wait_s": wait,
                "bubble": wait / wall if wall > 0 else 0.0, "bytes_sent": self.bytes_sent - sent0,
                "activation_bytes": self.activation_bytes()}

    def forward(self, x, rows):
        """Run a forward pass of ``rows`` samples through the pipeline (evaluation, no micro-batches).

        Parameters
        ----------
        x : ndarray, shape (rows, F) or None
            The input, read by stage 0 only.
        rows : int
            Number of samples (known on every stage).

        Returns
        -------
        ndarray, shape (rows, classes), or None
            The logits on the last stage; None on the others.
        """
        slot = self._slot()
        h = x if self.stage == 0 else self._recv(slot, "x", rows, self.in_width, self.stage - 1, 0)
        for layer in slot["layers"]:
            h = layer.forward(h)
        if self.stage == self.stages - 1:
            return h
        _sync(h)
        req = self.comm.Isend(h, dest=self.stage + 1, tag=0)
        wait_all([req], [-1 - (self.stage + 1)], deadline_of(self.timeout), Where("pipeline send", 0, "forward", self.timeout))
        return None
