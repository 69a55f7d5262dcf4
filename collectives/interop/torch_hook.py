"""PyTorch adapters: a DDP communication hook and a Horovod-style ``DistributedOptimizer``.

Both move gradients with commlab's collectives (any all-reduce algorithm, or any compressor of
:mod:`collectives.compression` with its error-feedback memory) while PyTorch keeps the model and the
optimizer. PyTorch is imported inside the functions that need it, never when ``collectives`` is
imported, so commlab runs without it.

* :func:`commlab_hook` with :class:`CommHookState`: ``ddp_model.register_comm_hook(state, commlab_hook)``.
  DDP hands each gradient bucket (a flat tensor) to the hook, which averages it over the ranks of
  ``state.comm`` and returns the completed ``torch.futures.Future`` DDP waits on. DDP's own process
  group (gloo on CPU) still does its bookkeeping (parameter broadcast at construction, bucket
  rebuilding); the gradients go through MPI. Buckets and hooks: Li et al. 2020, "PyTorch
  Distributed: Experiences on Accelerating Data Parallel Training", VLDB, section 3.2.
* :class:`DistributedOptimizer`: wraps any ``torch.optim.Optimizer``; ``step()`` first averages every
  parameter's gradient in one fused flat buffer, then steps (Sergeev and Del Balso 2018, "Horovod:
  fast and easy distributed deep learning in TensorFlow", section 4). :func:`broadcast_parameters`
  makes every rank start from root's weights.
"""
import numpy as np
from mpi4py import MPI

from collectives.calls import allreduce as api

from collectives.calls import rooted
from collectives.arguments import check_choice, check_timeout
from collectives.engine.context import free_context

__all__ = ["CommHookState", "commlab_hook", "DistributedOptimizer", "broadcast_parameters"]


def _bucket_shapes(bucket):
    """Return the shapes of the parameters in a DDP ``GradBucket``, in flat order."""
    return [tuple(p.shape) for p in bucket.parameters()]


def _check_start_iter(compression, error_feedback, args):
    """Apply PyTorch's rule for PowerSGD under DDP: ``start_iter`` defaults to 2, and is at least 2
    with error feedback or warm start (DDP rebuilds its buckets after the first step)."""
    if compression != "powersgd":
        return args
    from collectives.compression import parse_literal

    args = dict(args)
    args.setdefault("start_iter", 2)
    start, warm = args["start_iter"], args.get("warm_start", True)
    feedback = parse_literal(error_feedback) if isinstance(error_feedback, str) else error_feedback
    warm = parse_literal(warm) if isinstance(warm, str) else warm
    if isinstance(start, int) and not isinstance(start, bool) and start < 2 and (feedback is not False or warm):
        raise ValueError(f"start_iter must be >= 2 with error feedback or warm start, got {start} (DDP rebuilds "
                         "its buckets after the first step; PyTorch's start_powerSGD_iter has the same rule)")
    return args


class CommHookState:
    """State of :func:`commlab_hook`: communicator, algorithm, compressor and error feedback per bucket.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        Communicator (``MPI.COMM_WORLD`` by default), duplicated here; its ranks must be DDP's ranks
        in the same order. Collective: every rank builds the state at the same point.
    algorithm : str
        All-reduce algorithm, a key of ``collectives.ALGORITHMS`` (``auto`` by default).
    compression : str
        A key of ``collectives.compression.COMPRESSORS``; ``"none"`` (default) averages the bucket
        with the all-reduce alone, bitwise like DDP's default hook for ``mpi``.
    error_feedback : bool or None
        Error feedback for the compressor (None: the compressor's default).
    timeout : float, optional
        Seconds any round of the all-reduce may wait for a peer (``CollectiveTimeout`` after).
    **compressor_args
        Compressor arguments, e.g. ``matrix_rank=2`` for ``powersgd``, ``ratio=0.01`` for ``topk``.
        For ``powersgd``, ``start_iter`` (steps averaged by a plain all-reduce first) defaults to 2
        and must be at least 2 with error feedback or warm start, PyTorch's rule for
        ``start_powerSGD_iter``; ``min_compression_rate`` is PyTorch's argument of that name.

    Attributes
    ----------
    iteration : int
        Buckets reduced so far, counted over all steps.
    hooks : dict
        Bucket key -> ``((parameter keys, parameter shapes), CompressionHook)``: one compressor and
        memory per bucket (PowerSGD's matrix layout follows the bucket's parameter shapes). When DDP
        rebuilds its buckets (after the first step, in the order the gradients became ready), every
        bucket's state (residuals, warm-start Qs, step counters) is split by parameter and handed to
        the new buckets holding those parameters, so nothing is lost.

    Raises
    ------
    ValueError
        Unknown ``algorithm`` or ``compression``, a ``timeout`` that is not a positive number, or a
        PowerSGD ``start_iter`` below 2 with error feedback or warm start.

    Examples
    --------
    >>> state = CommHookState(compression="powersgd", matrix_rank=2)  # doctest: +SKIP
    >>> ddp_model.register_comm_hook(state, commlab_hook)  # doctest: +SKIP
    """

    __slots__ = ("comm", "algorithm", "compression", "error_feedback", "compressor_args", "timeout",
                 "iteration", "hooks", "_carried")

    def __init__(self, comm=None, algorithm="auto", compression="none", error_feedback=None, timeout=None,
                 **compressor_args):
        from collectives.compression import COMPRESSORS

        check_choice(algorithm, api.ALGORITHMS)
        check_choice(compression, COMPRESSORS, "compression")
        timeout = check_timeout(timeout)
        compressor_args = _check_start_iter(compression, error_feedback, compressor_args)
        self.comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self.algorithm = algorithm
        self.compression = compression
        self.error_feedback = error_feedback
        self.compressor_args = dict(compressor_args)
        self.timeout = timeout
        self.iteration = 0
        self.hooks = {}
        self._carried = {}  # parameter key -> its share of a rebuilt bucket's state
        if compression != "none":  # check the compressor's arguments now, on every rank
            from collectives.compression import make_compressor

            make_compressor(compression, **self._args([(4, 4)]))

    def _args(self, shapes):
        from collectives.compression import compressor_arguments

        args = dict(self.compressor_args)
        if "shapes" in compressor_arguments(self.compression):
            args["shapes"] = shapes
        return args

    def _hook(self, key, shapes, params=None):
        """Return the ``CompressionHook`` of bucket ``key``; a new one when its parameters changed.

        A change of any bucket is DDP's rebuild: every bucket's state is first split by parameter
        (``_carry_all``), and each new bucket's hook starts from its parameters' shares.
        """
        shapes = None if shapes is None else tuple(tuple(int(d) for d in s) for s in shapes)
        params = None if params is None else tuple(params)
        entry = self.hooks.get(key)
        if entry is not None and entry[0] == (params, shapes):
            return entry[1]
        if entry is not None and entry[0] == (None, shapes) and params is not None:
            self.hooks[key] = ((params, shapes), entry[1])  # restored from a checkpoint: now named
            return entry[1]
        from collectives.compression import make_hook

        if entry is not None:
            self._carry_all()  # collective, like the rebuild itself
        args = self._args(list(shapes) if shapes is not None else None)
        args.pop("shapes", None)
        hook = make_hook(self.compression, comm=self.comm, algorithm=self.algorithm,
                         error_feedback=self.error_feedback, shapes=shapes, **args)
        if params is not None and shapes is not None and self._carried:
            _restore(hook, params, shapes, self._carried)
        self.hooks[key] = ((params, shapes), hook)
        return hook

    def _carry_all(self):
        """Split every bucket's state by parameter into ``_carried`` and free the buckets' hooks."""
        for (params, shapes), hook in self.hooks.values():
            if params is not None and shapes is not None:
                self._carried.update(_split(hook, params, shapes))
            hook.close()
        self.hooks.clear()

    def reduce(self, flat, key=0, shapes=None, params=None):
        """Average ``flat`` over the ranks, in place, and return it.

        Without compression one all-reduce; with it, the bucket's own
        :class:`~collectives.compression.hook.GradientHook` (a :class:`CompressionHook` keyed by ``key``).

        Parameters
        ----------
        flat : torch.Tensor or ndarray, shape (n,), float32/float64 (also bfloat16/float16 without compression)
            One bucket's gradients.
        key : int or str
            The bucket's key for its compressor state (DDP's bucket index).
        shapes : list of tuple of int, optional
            Parameter shapes in the bucket, in flat order (PowerSGD's matrices).
        params : list of hashable, optional
            One key per parameter, in the order of ``shapes`` (DDP: the parameters' ``id``); the
            compressor state follows these keys when a bucket's parameters change.

        Returns
        -------
        torch.Tensor or ndarray
            ``flat``, now holding the mean over ranks.
        """
        self.iteration += 1
        if self.compression == "none":
            return api.allreduce(flat, comm=self.comm, op="avg", algorithm=self.algorithm, out=flat,
                                 timeout=self.timeout)
        view = np.from_dlpack(flat.detach() if hasattr(flat, "detach") else flat)  # zero-copy (n,)
        avg, _ = self._hook(key, shapes, params)(view)
        view[...] = avg
        return flat

    def state_dict(self):
        """Return the state as str -> NumPy array (collective: every rank calls it at the same point).

        Returns
        -------
        dict
            ``iteration`` and, per bucket key ``k``, ``bucket{k}/...`` entries of its
            ``CompressionHook`` (the memory of every rank stacked, see ``CompressionHook.state_dict``).
        """
        state = {"iteration": np.array(self.iteration, np.int64)}
        for key in sorted(self.hooks, key=str):
            state.update({f"bucket{key}/{k}": v for k, v in self.hooks[key][1].state_dict().items()})
        return state

    def load_state_dict(self, state, shapes_of):
        """Restore :meth:`state_dict`'s output (collective).

        Parameters
        ----------
        state : dict
            From :meth:`state_dict`.
        shapes_of : dict
            Bucket key -> its parameter shapes, to rebuild each bucket's compressor before loading its
            state (DDP: ``{bucket.index(): shapes}`` as the buckets were when saved).
        """
        self.iteration = int(state["iteration"])
        for key, shapes in sorted(shapes_of.items(), key=lambda kv: str(kv[0])):
            prefix = f"bucket{key}/"
            mine = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            if mine and self.compression != "none":
                self._hook(key, shapes).load_state_dict(mine)

    def close(self):
        """Free the per-bucket hooks and the duplicated communicator."""
        for _, hook in self.hooks.values():
            hook.close()
        self.hooks.clear()
        if self.comm != MPI.COMM_NULL:
            free_context(self.comm)
            self.comm.Free()


def commlab_hook(state, bucket):
    """DDP communication hook: average a gradient bucket with commlab.

    Register with ``ddp_model.register_comm_hook(state, commlab_hook)``.

    Parameters
    ----------
    state : CommHookState
        The communicator, algorithm and compressor state.
    bucket : torch.distributed.GradBucket
        DDP's bucket; ``bucket.buffer()`` is a flat tensor, shape (n,), of the parameters' dtype.

    Returns
    -------
    torch.futures.Future
        Completed future holding the averaged flat tensor (the bucket's own memory).
    """
    import torch

    buf = bucket.buffer()
    shapes = params = None
    if state.compression != "none":
        shapes = _bucket_shapes(bucket)
        params = [id(p) for p in bucket.parameters()]  # the model's own Parameter objects
    result = state.reduce(buf, bucket.index(), shapes, params)
    fut = torch.futures.Future()
    fut.set_result(result)
    return fut


def _split(hook, params, shapes):
    """Return ``{parameter key: its share of hook's state}``.

    Per-element arrays of the memory (residuals, DGC's momentum: as many elements as the bucket) are
    cut at the parameters' offsets; PowerSGD's warm-start Q of piece ``i`` belongs to parameter ``i``;
    scalar counters go to every parameter.
    """
    sizes = [int(np.prod(s)) for s in shapes]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    total, qs = int(starts[-1]), f"q/{hook.name}/"
    shares = {p: {"memory": {}, "compressor": {}, "iteration": hook.iteration} for p in params}
    for k, v in hook.compressor.state_dict().items():
        if k.startswith(qs):
            shares[params[int(k[len(qs):])]]["compressor"][k] = v
        else:
            for share in shares.values():
                share["compressor"][k] = v
    if hook.memory is not None:
        for k, v in hook.memory.state_dict().items():
            v = np.asarray(v)
            for i, p in enumerate(params):
                shares[p]["memory"][k] = v.ravel()[starts[i]:starts[i + 1]] if v.size == total else v
    return shares


def _restore(hook, params, shapes, carried):
    """Load the shares of ``params`` (taken out of ``carried``) into a new bucket's ``hook``."""
    mine = [carried.pop(p, None) for p in params]
    if not any(mine):
        return
    qs = f"q/{hook.name}/"
    compressor, memory = {}, {}
    for i, share in enumerate(mine):
        for k, v in (share or {}).get("compressor", {}).items():
            if k.startswith(qs):
                compressor[f"{qs}{i}"] = v
            elif k not in compressor or np.asarray(v).ndim == 0 and int(v) > int(compressor[k]):
                compressor[k] = v  # counters: the furthest one (they agree under DDP)
    hook.compressor.load_state_dict(compressor)
    hook.iteration = max(share["iteration"] for share in mine if share)
    if hook.memory is not None:
        keys = sorted({k for share in mine if share for k in share["memory"]})
        for k in keys:
            pieces = [share["memory"].get(k) if share else None for share in mine]
            known = next(v for v in pieces if v is not None)
            if all(v is None or v.size == int(np.prod(s)) for v, s in zip(pieces, shapes)):  # per element
                memory[k] = np.concatenate([v if v is not None else np.zeros(int(np.prod(s)), known.dtype)
                                            for v, s in zip(pieces, shapes)])
            else:
                memory[k] = known
        hook.memory.load_state_dict(memory)


class DistributedOptimizer:
    """Horovod-style optimizer wrapper: average the gradients over the ranks, then step.

    ``step()`` gathers every parameter gradient into one flat buffer (one fused all-reduce, or the
    compressor's exchange), writes the mean back into each ``p.grad`` and calls the wrapped
    optimizer's ``step``. Everything else (``zero_grad``, ``param_groups``, ``state_dict``, ...) is the
    wrapped optimizer's. Parameters without a gradient count as zero on that rank, so every rank
    sends the same message.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The local optimizer.
    comm : mpi4py.MPI.Intracomm, optional
        Communicator (``MPI.COMM_WORLD`` by default), duplicated here.
    algorithm : str
        All-reduce algorithm (``collectives.ALGORITHMS``).
    compression : str
        Compressor name (``collectives.compression.COMPRESSORS``), ``"none"`` by default.
    error_feedback : bool or None
        Error feedback for the compressor (None: its default).
    timeout : float, optional
        Seconds any round may wait for a peer.
    **compressor_args
        Compressor arguments.

    Raises
    ------
    TypeError
        ``optimizer`` has no ``param_groups``.
    ValueError
        Unknown algorithm or compressor, or parameters of different dtypes.
    """

    def __init__(self, optimizer, comm=None, algorithm="auto", compression="none", error_feedback=None,
                 timeout=None, **compressor_args):
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if len({p.dtype for p in params}) > 1:
            raise ValueError("DistributedOptimizer: all parameters must share one dtype, got "
                             + ", ".join(sorted({str(p.dtype) for p in params})))
        self.optimizer = optimizer
        self._params = params
        self._state = CommHookState(comm, algorithm, compression, error_feedback, timeout, **compressor_args)

    def __getattr__(self, name):
        if name in ("optimizer", "_params", "_state"):
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    @property
    def state(self):
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @property
    def comm_state(self):
        """The :class:`CommHookState` (communicator, compressor and error feedback)."""
        return self._state

    def synchronize(self):
        """Average every parameter's gradient over the ranks, in place (``p.grad`` is created if None)."""
        import torch

        if not self._params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        flat = torch.cat([g.detach().reshape(-1) for g in grads])  # (n,) fused buffer
        self._state.reduce(flat, "all", [tuple(p.shape) for p in self._params])
        start = 0
        for p in self._params:
            n = p.numel()
            piece = flat[start:start + n].view_as(p)
            if p.grad is None:
                p.grad = piece.clone()
            else:
                p.grad.copy_(piece)
            start += n

    def step(self, closure=None):
        """Average the gradients, then run the wrapped optimizer's ``step``."""
        self.synchronize()
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def zero_grad(self, set_to_none=True):
        """Clear the gradients (the wrapped optimizer's ``zero_grad``)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        """Return the wrapped optimizer's state dict plus ``"commlab"``: the compressor state."""
        sd = self.optimizer.state_dict()
        sd["commlab"] = self._state.state_dict()
        return sd

    def load_state_dict(self, state_dict):
        """Restore :meth:`state_dict`'s output."""
        state_dict = dict(state_dict)
        comm_state = state_dict.pop("commlab", None)
        self.optimizer.load_state_dict(state_dict)
        if comm_state is not None:
            self._state.load_state_dict(comm_state, {"all": [tuple(p.shape) for p in self._params]})

    def close(self):
        """Free the duplicated communicator."""
        self._state.close()


def broadcast_parameters(params, root=0, comm=None):
    """Copy root's parameter values into every rank's, in place (Horovod's ``broadcast_parameters``).

    Parameters
    ----------
    params : iterable of torch.Tensor, or a ``state_dict``-like mapping
        The tensors to overwrite (each broadcast with commlab's tree broadcast, in order).
    root : int
        Rank whose values win.
    comm : mpi4py.MPI.Intracomm, optional
        Communicator (``MPI.COMM_WORLD`` by default).
    """
    import torch

    tensors = list(params.values()) if hasattr(params, "values") else list(params)
    with torch.no_grad():
        for t in tensors:
            rooted.broadcast(t.detach(), root=root, comm=comm)
