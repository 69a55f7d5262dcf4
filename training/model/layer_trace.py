"""Per-layer trace events of a :class:`training.model.nn.Sequential`: the job profile's raw material.

With :mod:`commlab.tracing` on, ``Sequential.forward`` and ``Sequential.backward`` run their
layers through :func:`forward` and :func:`backward` here, which record each layer's pass as one
``layer`` event in the ``compute`` lane with :func:`layer_args` (its index, kind, rows, parameter
count and flat offset, widths); :mod:`training.predict.profile` reads them back. Off, the model
never calls this module.
"""
import math

from commlab import tracing

__all__ = ["layer_args", "forward", "backward"]


def layer_args(model, i, direction, rows):
    """Return the trace arguments of layer ``i``'s event.

    Parameters
    ----------
    model : training.model.nn.Sequential
    i : int
        Layer index.
    direction : {"forward", "backward"}
    rows : int
        Batch rows of the pass.

    Returns
    -------
    dict
        ``layer``, ``kind`` (class name), ``direction``, ``rows``, ``params`` (elements), ``offset``
        (element offset of its first parameter in the flat gradient, None without parameters),
        ``itemsize`` (bytes), and ``n_in`` / ``n_out`` for a layer that has them.

    Examples
    --------
    >>> from training.model.nn import build_mlp
    >>> layer_args(build_mlp([4, 8, 3]), 2, "forward", 5)
    {'layer': 2, 'kind': 'Linear', 'direction': 'forward', 'rows': 5, 'params': 27, 'offset': 40, 'itemsize': 4, 'n_in': 8, 'n_out': 3}
    """
    layer = model.layers[i]
    first = sum(len(other.param_shapes()) for other in model.layers[:i])
    n = sum(math.prod(s) for s in layer.param_shapes())
    args = {"layer": i, "kind": type(layer).__name__, "direction": direction, "rows": int(rows),
            "params": int(n), "offset": int(model.slices[first][1]) if n else None,
            "itemsize": int(model.dtype.itemsize)}
    for name in ("n_in", "n_out"):
        if hasattr(layer, name):
            args[name] = int(getattr(layer, name))
    return args


def forward(model, x):
    """Run ``model``'s layers forward on ``x``, one ``layer`` event each; return the logits."""
    for i, layer in enumerate(model.layers):
        with tracing.span("layer", "compute", layer_args(model, i, "forward", x.shape[0])):
            x = layer.forward(x)
    return x


def backward(model, dy, on_grad=None):
    """Run ``model``'s layers backward from ``dy``, one ``layer`` event each (``on_grad`` as in the model)."""
    for i in range(len(model.layers) - 1, -1, -1):
        with tracing.span("layer", "compute", layer_args(model, i, "backward", dy.shape[0])):
            dy = model.layers[i].backward(dy, need_input_grad=i > 0)
        if on_grad is not None:
            on_grad(i)
