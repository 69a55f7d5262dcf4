"""The compressor registry: names, construction from keyword arguments, and ``KEY=VALUE`` parsing
(the one reading of command-line ``KEY=VALUE`` values in commlab)."""
import ast
import inspect

from .dgc import DGC
from .powersgd import PowerSGD
from .qsgd import QSGD
from .quantize import BF16Compressor, FP16Compressor, Int8Compressor, NoneCompressor
from .sign import EFSignSGD, OneBit, SignSGD
from .sparse import RandomK, Threshold, TopK
from .terngrad import TernGrad

__all__ = ["COMPRESSORS", "make_compressor", "compressor_arguments", "parse_compression_args",
           "parse_compression_arg", "parse_literal", "split_key_value"]

COMPRESSORS = {
    "none": NoneCompressor,
    "fp16": FP16Compressor,
    "bf16": BF16Compressor,
    "int8": Int8Compressor,
    "qsgd": QSGD,
    "terngrad": TernGrad,
    "signsgd": SignSGD,
    "efsignsgd": EFSignSGD,
    "onebit": OneBit,
    "topk": TopK,
    "randomk": RandomK,
    "threshold": Threshold,
    "dgc": DGC,
    "powersgd": PowerSGD,
}


def compressor_arguments(name):
    """Return ``{argument: default}`` of the compressor registered as ``name``.

    Raises
    ------
    ValueError
        If ``name`` is not registered.

    Examples
    --------
    >>> compressor_arguments("topk")
    {'ratio': 0.01, 'k': None, 'seed': 0}
    """
    if name not in COMPRESSORS:
        raise ValueError(f"name must be one of {sorted(COMPRESSORS)}, got {name!r}")
    params = inspect.signature(COMPRESSORS[name].__init__).parameters
    return {k: p.default for k, p in params.items() if k != "self"}


def parse_literal(text):
    """Read a command-line value: bool, None, int, float or another Python literal; else the string.

    ``true``/``false`` (any case) are booleans, ``none``/``null`` None; then Python literals
    (``3``, ``1e-3``, ``[(64, 784), (64,)]``), then ``float`` (``inf``); anything else stays text.
    This is the one reading of ``KEY=VALUE`` values in commlab (``--compression-arg``, compressor
    specs, the studies' ``--set``).

    Parameters
    ----------
    text : str

    Returns
    -------
    bool, None, int, float, str or another literal

    Examples
    --------
    >>> [parse_literal(t) for t in ("True", "null", "3", "1e-3", "inf", "[(64, 784)]", "topk")]
    [True, None, 3, 0.001, inf, [(64, 784)], 'topk']
    """
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return float(text)
    except ValueError:
        return text


def split_key_value(text, what="argument"):
    """Split ``"KEY=VALUE"`` into ``(key, value text)``, the key stripped.

    Parameters
    ----------
    text : str
        One ``KEY=VALUE`` item; the value may itself contain ``=``.
    what : str
        What the item is, for the error message (``"--set"``, ``"compression argument"``).

    Returns
    -------
    tuple of (str, str)

    Raises
    ------
    ValueError
        Naming ``what``, when ``text`` has no ``=`` or an empty key.

    Examples
    --------
    >>> split_key_value(" spec = a=b")
    ('spec', ' a=b')
    >>> split_key_value("ratio", "--set")
    Traceback (most recent call last):
    ...
    ValueError: --set must look like KEY=VALUE, got 'ratio'
    """
    key, sep, value = str(text).partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{what} must look like KEY=VALUE, got {text!r}")
    return key.strip(), value


def parse_compression_arg(text):
    """Return ``(key, value)`` of one ``--compression-arg KEY=VALUE`` (value read by :func:`parse_literal`).

    Parameters
    ----------
    text : str
        For example ``"ratio=0.01"`` -> ``("ratio", 0.01)``.

    Returns
    -------
    tuple of (str, object)

    Raises
    ------
    ValueError
        When ``text`` has no ``=`` or an empty key.

    Examples
    --------
    >>> parse_compression_arg("ratio=0.01")
    ('ratio', 0.01)
    """
    key, value = split_key_value(text, "compression argument")
    return key, parse_literal(value)


def _coerce(value, default):
    """Parse a string ``value`` as a literal; an int becomes a float where the default is a float."""
    if not isinstance(value, str):
        return value
    parsed = parse_literal(value)
    if isinstance(default, float) and type(parsed) is int:
        return float(parsed)
    return parsed


def parse_compression_args(items):
    """Turn ``["KEY=VALUE", ...]`` (the ``--compression-arg`` flags) into a dict of Python values.

    Values are read by :func:`parse_literal`: bool (``true``/``false``), None, int, float or another
    Python literal (``[(64, 784), (64,)]``); anything else stays a string.

    Raises
    ------
    ValueError
        If an item has no ``=`` or an empty key.

    Examples
    --------
    >>> parse_compression_args(["ratio=0.5", "rescale=true", "shapes=[(2, 3)]"])
    {'ratio': 0.5, 'rescale': True, 'shapes': [(2, 3)]}
    """
    return dict(parse_compression_arg(item) for item in items or ())


def make_compressor(name, **kwargs):
    """Build the compressor registered as ``name``.

    Parameters
    ----------
    name : str
        A key of ``COMPRESSORS``.
    **kwargs
        Constructor arguments; strings are converted to the type of the argument's default.

    Returns
    -------
    Compressor

    Raises
    ------
    ValueError
        If ``name`` is unknown, an argument is unknown (naming it), not a number where its default
        is one, or out of range.

    Examples
    --------
    >>> import numpy as np
    >>> c = make_compressor("topk", k="2")  # a string is read as a literal
    >>> c
    TopK(ratio=0.01, k=2)
    >>> payloads, ctx = c.compress(np.array([0.0, -5.0, 1.0, 3.0], np.float32), "w")
    >>> c.decompress(payloads, ctx)  # the two largest magnitudes
    array([ 0., -5.,  0.,  3.], dtype=float32)
    >>> make_compressor("topk", levels=4)
    Traceback (most recent call last):
    ...
    ValueError: unknown argument(s) ['levels'] for compressor 'topk'; accepted: ['k', 'ratio', 'seed']
    """
    accepted = compressor_arguments(name)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ValueError(f"unknown argument(s) {unknown} for compressor {name!r}; "
                         f"accepted: {sorted(accepted)}")
    kwargs = {k: _coerce(v, accepted[k]) for k, v in kwargs.items()}
    for k, v in kwargs.items():
        numeric = isinstance(accepted[k], (int, float)) and not isinstance(accepted[k], bool)
        if numeric and isinstance(v, (str, bool)):
            raise ValueError(f"{k} must be a number, got {v!r}")
    return COMPRESSORS[name](**kwargs)
