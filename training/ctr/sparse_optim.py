"""Sparse optimizers for embedding rows: update only the rows a batch touched.

The parameter servers call ``sparse_step(ids, rows)`` on a shard's table (:mod:`ps.embedding.sparse_push_pull`). SGD and
Adagrad do, on each touched row, exactly the operations of their dense forms
(:class:`training.model.optim.SGD` with momentum 0, :class:`training.model.optim.Adagrad`), and a row whose gradient
is zero is left unchanged by the dense forms: so the sparse and the dense update give the same table,
to the last bit for the same gradient. SGD with momentum keeps a velocity per row and decays it only when
the row is touched (lazy momentum, as TensorFlow's and PyTorch's sparse optimizers do), which differs from
the dense form whenever a row with velocity is not in the batch.
"""
import numpy as np

__all__ = ["SparseSGD", "SparseAdagrad", "make_sparse_optimizer"]


class _Sparse:
    """Base: the table ``(rows, width)``, ``lr``, ``steps``, and the state arrays' checkpoint form."""

    def __init__(self, table, lr):
        if table.ndim != 2 or table.dtype.kind != "f":
            raise ValueError(f"table must be a 2-D float array, got {table.dtype} of shape {table.shape}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr!r}")
        self.table, self.lr, self.steps = table, float(lr), 0

    def _state(self):
        return {}

    def state_dict(self):
        """Return ``{"steps": ..., state arrays...}`` (plain arrays, for :func:`commlab.file_formats.write_npz`)."""
        return {"steps": np.array(self.steps, np.int64), **self._state()}

    def load_state_dict(self, d):
        """Restore :meth:`state_dict` output.

        Raises
        ------
        ValueError
            When a key is missing or an array has another shape.
        """
        for key, arr in self._state().items():
            if key not in d or tuple(d[key].shape) != arr.shape:
                raise ValueError(f"optimizer state {key!r} missing or of another shape than {arr.shape}")
            arr[...] = d[key]
        self.steps = int(d["steps"])


class SparseSGD(_Sparse):
    """SGD on the touched rows: ``v[i] = momentum v[i] + g;  w[i] -= lr v[i]`` (lazy momentum).

    Parameters
    ----------
    table : ndarray, shape (n, width), float32 or float64
        Updated in place.
    lr : float
        Step size.
    momentum : float
        0 for plain SGD (the dense form's update exactly).

    Examples
    --------
    >>> table = np.ones((3, 2))
    >>> opt = SparseSGD(table, lr=0.5)
    >>> opt.sparse_step(np.array([2]), np.array([[1.0, -1.0]]))
    >>> table.tolist()
    [[1.0, 1.0], [1.0, 1.0], [0.5, 1.5]]
    """

    def __init__(self, table, lr=0.1, momentum=0.0):
        super().__init__(table, lr)
        self.momentum = float(momentum)
        self.velocity = np.zeros_like(table) if momentum else None

    def sparse_step(self, ids, rows):
        """Update rows ``ids`` (distinct, int64) with their gradients ``rows`` (shape (len(ids), width))."""
        g = rows
        if self.velocity is not None:
            v = self.velocity[ids] * self.momentum
            v += g
            self.velocity[ids] = g = v
        self.table[ids] -= g * self.lr
        self.steps += 1

    def _state(self):
        return {"velocity": self.velocity} if self.velocity is not None else {}


class SparseAdagrad(_Sparse):
    """Adagrad on the touched rows: ``a[i] += g^2;  w[i] -= lr g / (sqrt(a[i]) + eps)``.

    Duchi, Hazan and Singer, JMLR 2011; the operations of :class:`training.model.optim.Adagrad` in its order.

    Examples
    --------
    >>> table = np.ones((2, 1))
    >>> opt = SparseAdagrad(table, lr=0.5)
    >>> opt.sparse_step(np.array([1]), np.array([[3.0]]))
    >>> table.ravel().round(6).tolist(), opt.accum.ravel().tolist()
    ([1.0, 0.5], [0.0, 9.0])
    """

    def __init__(self, table, lr=0.01, eps=1e-10):
        super().__init__(table, lr)
        if not eps > 0:
            raise ValueError(f"eps must be > 0 (a touched row's element with a zero gradient: 0 / eps), got {eps!r}")
        self.eps = float(eps)
        self.accum = np.zeros_like(table)

    def sparse_step(self, ids, rows):
        """Update rows ``ids`` (distinct, int64) with their gradients ``rows`` (shape (len(ids), width))."""
        a = self.accum[ids]
        a += rows * rows
        self.accum[ids] = a
        tmp = np.sqrt(a)
        tmp += self.eps
        np.divide(rows, tmp, out=tmp)
        tmp *= self.lr
        self.table[ids] -= tmp
        self.steps += 1

    def _state(self):
        return {"accum": self.accum}


def make_sparse_optimizer(cfg):
    """Return ``make(table) -> sparse optimizer`` for ``cfg.optimizer`` (sgd or adagrad).

    Raises
    ------
    ValueError
        For Adam, whose sparse form is not provided here (use sgd or adagrad with ``--mode ps/hybrid``).

    Examples
    --------
    >>> from training.settings.config import Config
    >>> type(make_sparse_optimizer(Config(optimizer="adagrad"))(np.zeros((2, 2)))).__name__
    'SparseAdagrad'
    """
    if cfg.optimizer == "sgd":
        return lambda table: SparseSGD(table, cfg.lr, cfg.momentum)
    if cfg.optimizer == "adagrad":
        return lambda table: SparseAdagrad(table, cfg.lr, cfg.eps)
    raise ValueError(f"--model ctr with --mode ps or hybrid needs --optimizer sgd or adagrad (sparse updates on "
                     f"the servers), got {cfg.optimizer!r}")
