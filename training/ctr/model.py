"""The ctr model: embedding rows, mean-pooled per feature, concatenated and fed to an MLP with one logit.

A batch's ids (shape ``(B, F, bag)``) are reduced to their distinct rows first (``numpy.unique``), so the
model reads and differentiates only the rows the batch touches: :meth:`CTRModel.step` takes those rows'
values (however they were fetched: a local table, or a pull from the parameter servers) and returns the
gradient of each of them (repeated ids add up in their row) beside the MLP's gradient in ``mlp.grads``.
The loss is the logistic loss (binary cross-entropy on the logit) averaged over the batch.
"""
import numpy as np

from training.model.nn import build_mlp

__all__ = ["CTRModel", "unique_rows", "init_table", "auc_logloss"]


def unique_rows(ids):
    """Return ``(rows, inverse)``: the distinct row ids of a batch (ascending, int64) and each id's index into them.

    Examples
    --------
    >>> rows, inv = unique_rows(np.array([[[7, 7]], [[2, 9]]]))
    >>> rows.tolist(), inv.tolist()
    ([2, 7, 9], [[[1, 1]], [[0, 2]]])
    """
    rows, inverse = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)
    return rows, inverse.reshape(np.shape(ids))


def init_table(rows, dim, dtype, seed):
    """Return the initial embedding table (shape (rows, dim)): normal, standard deviation 0.05, seeded.

    Examples
    --------
    >>> init_table(3, 2, "float64", 0).shape
    (3, 2)
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(4)[3])
    return (rng.standard_normal((rows, dim)) * 0.05).astype(dtype)


def _sigmoid(z):
    return np.exp(-np.logaddexp(0.0, -z))


class CTRModel:
    """Pooled embeddings into an MLP (``F * dim -> hidden... -> 1``), logistic loss.

    Parameters
    ----------
    tables, dim, bag : int
        Features ``F``, embedding width and ids per feature.
    hidden : tuple of int
        Hidden widths of the MLP.
    activation, dtype : str
    seed : int
        Seed of the MLP's initialization.

    Attributes
    ----------
    mlp : training.model.nn.Sequential
        The dense layers; ``mlp.params`` and ``mlp.grads`` are their flat buffers.

    Examples
    --------
    >>> m = CTRModel(2, 4, 1, (8,), dtype="float64")
    >>> ids = np.array([[[0], [3]], [[0], [5]]])
    >>> rows, inv = unique_rows(ids)
    >>> loss, g = m.step(np.ones((rows.size, 4)), inv, np.array([1.0, 0.0]))
    >>> g.shape, float(loss) > 0
    ((3, 4), True)
    """

    def __init__(self, tables, dim, bag, hidden, activation="relu", dtype="float32", seed=0):
        self.tables, self.dim, self.bag = int(tables), int(dim), int(bag)
        self.mlp = build_mlp([self.tables * self.dim, *hidden, 1], activation, dtype, seed)
        self.dtype = self.mlp.dtype

    def logits(self, values, inverse):
        """Return the logits (shape (B,)) from the rows' ``values`` (n, dim) and ``inverse`` (B, F, bag)."""
        pooled = values[inverse].mean(axis=2)  # (B, F, dim)
        return self.mlp.forward(pooled.reshape(inverse.shape[0], -1))[:, 0]

    def step(self, values, inverse, y):
        """Forward and backward on one batch.

        Parameters
        ----------
        values : ndarray, shape (n, dim)
            The batch's distinct rows.
        inverse : ndarray, shape (B, F, bag), int
            Index into ``values`` of every id.
        y : ndarray, shape (B,)
            Labels 0/1.

        Returns
        -------
        loss : float
            Mean logistic loss.
        row_grads : ndarray, shape (n, dim)
            Gradient of the loss with respect to each row (repeated ids summed).
        """
        B = inverse.shape[0]
        z = self.logits(values, inverse)
        y = y.astype(self.dtype)
        loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
        dy = ((_sigmoid(z) - y) / B).astype(self.dtype)[:, None]  # (B, 1)
        for i in range(len(self.mlp.layers) - 1, -1, -1):
            dy = self.mlp.layers[i].backward(dy, need_input_grad=True)
        per_id = np.repeat(dy.reshape(B, self.tables, 1, self.dim) / self.bag, self.bag, axis=2)  # (B, F, bag, dim)
        row_grads = np.zeros((values.shape[0], self.dim), self.dtype)
        np.add.at(row_grads, inverse.reshape(-1), per_id.reshape(-1, self.dim))
        return loss, row_grads

    def predict(self, table, ids, batch=65536):
        """Return the click probabilities (shape (n,)) of samples ``ids`` (n, F, bag) with the whole ``table``."""
        out = np.empty(ids.shape[0])
        for lo in range(0, ids.shape[0], batch):
            rows, inv = unique_rows(ids[lo:lo + batch])
            out[lo:lo + batch] = _sigmoid(self.logits(table[rows], inv).astype(np.float64))
        return out


def auc_logloss(y, p):
    """Return ``(AUC, log loss)`` of probabilities ``p`` for labels ``y`` (sklearn's ``roc_auc_score``, ``log_loss``)."""
    from sklearn.metrics import log_loss, roc_auc_score

    auc = float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else float("nan")
    return auc, float(log_loss(y, np.clip(p, 1e-12, 1 - 1e-12), labels=[0, 1]))
