"""A job's compute profile from one traced run: per-layer forward and backward, optimizer, codecs.

    python -m training.predict.profile --trace FILE [--rank R] [--skip N] [--codec NAME[:K=V,...]]... --out FILE

reads a Chrome trace written by ``python -m training.train --trace FILE`` (one rank is enough; with
several, ``--rank`` picks one), keeps the steps after the first ``--skip``, and takes the median over
steps of every ``layer`` event (:mod:`training.model.layer_trace`: one per layer and direction), of the
forward and backward passes' time outside the layers (the loss), and of the ``optimizer`` event.
``--codec`` runs each named compressor on a gradient of the model's size on this machine and records
its compress and decompress seconds and the bytes of every payload it sends
(:func:`measure_codecs`; with ``--gradient-from CKPT`` on a gradient of the magnitudes of that run's,
:func:`gradient_rms`); the reduction speed of the host (``numpy.add`` on float32) is recorded too,
and for a codec whose payloads ride the all-reduce, the speed of ``numpy.add`` on its payload's dtype
(float16 adds are far slower than float32's on a CPU). This is
Daydream's idea (Zhu et al., USENIX ATC 2020, section 4): one run's kernel timeline is enough to
replay the step under another configuration.

Format (JSON): ``rows`` (batch rows per rank in the run), ``itemsize`` (bytes per gradient element),
``layers`` (list, first layer first, of ``{"kind", "params", "offset", "n_in", "n_out",
"forward_s", "backward_s"}``), ``extra_forward_s``, ``extra_backward_s``, ``optimizer_s`` (seconds),
``reduce_s_per_byte``, ``codecs`` (name -> ``{"args", "transport", "payload_bytes": [...],
"compress_s", "decompress_s"}``, and ``"reduce_s_per_byte"`` for an all-reduce transport) and ``source``.
"""
import contextlib
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, fields

import numpy

from training.predict.files import read_json
from training.settings.options import INT32_MAX, Parser, integer, outpath, text

__all__ = ["Profile", "from_trace", "synthetic", "measure_codecs", "load", "check", "codec_key", "find_codec", "main"]


@dataclass
class Profile:
    """One rank's compute profile (seconds at ``rows`` batch rows per rank; see the module's format)."""

    rows: int                       # batch rows per rank of the profiled run
    itemsize: int                   # bytes per gradient element
    layers: list                    # per layer: kind, params, offset, n_in, n_out, forward_s, backward_s
    optimizer_s: float = 0.0        # one optimizer step on the whole flat parameter vector (seconds)
    extra_forward_s: float = 0.0    # forward time outside the layers: the loss (seconds)
    extra_backward_s: float = 0.0   # backward time outside the layers (seconds)
    reduce_s_per_byte: float = 0.0  # host reduction speed, numpy.add (seconds per byte)
    codecs: dict = field(default_factory=dict)  # compressor name -> args, transport, payload_bytes, seconds
    source: str = ""                # where the numbers came from

    @property
    def elements(self):
        """Gradient elements (the model's parameter count)."""
        return sum(int(layer["params"]) for layer in self.layers)

    def slices(self):
        """Return ``(name, offset, size)`` per parameter, as ``Sequential.slices`` (W then b of a Linear)."""
        out = []
        for i, layer in enumerate(self.layers):
            n, off = int(layer["params"]), layer.get("offset")
            if not n:
                continue
            if layer.get("n_in") and layer.get("n_out") and n == layer["n_in"] * layer["n_out"] + layer["n_out"]:
                w = layer["n_in"] * layer["n_out"]
                out += [(f"{i}.W", off, w), (f"{i}.b", off + w, layer["n_out"])]
            else:
                out.append((f"{i}.p", off, n))
        return out

    def to_dict(self):
        """Return the profile as the JSON-ready dict of the module's format."""
        return asdict(self)


def load(path):
    """Read a profile JSON file written by :func:`main` (or :meth:`Profile.to_dict`).

    Raises
    ------
    ValueError
        A missing or malformed field, named.
    """
    d = read_json(path)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a profile holds one JSON object, got {type(d).__name__}")
    names = [f.name for f in fields(Profile)]
    for key in d:
        if key not in names:
            raise ValueError(f"{path}: profile field {key!r} is unknown; accepted: {', '.join(names)}")
    for key in ("rows", "itemsize", "layers"):
        if key not in d:
            raise ValueError(f"{path}: profile field {key!r} is missing")
    try:
        return check(Profile(**d))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


#: Largest batch rows, gradient elements and seconds a profile may hold: beyond them a number is an error.
_MAX_ROWS, _MAX_ELEMENTS, _MAX_SECONDS = 2 ** 31 - 1, 2 ** 40, 1e6
#: How a codec's payloads travel (``transport`` of a compressor).
_TRANSPORTS = ("allreduce", "allgather", "allgatherv", "own")


def _number(where, v, low=0.0, high=_MAX_SECONDS):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
        raise ValueError(f"profile field {where} must be a number in [{low:g}, {high:g}], got {v!r}")
    return v


def _count(where, v, low=0, high=_MAX_ELEMENTS):
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ValueError(f"profile field {where} must be an integer in [{low}, {high}], got {v!r}")
    return v


def check(profile):
    """Check every field of ``profile``; return it.

    ``rows`` >= 1; ``itemsize`` 2, 4 or 8; ``layers`` a non-empty list whose every layer has a name
    (``kind``), ``params`` >= 0 equal to ``n_in x n_out + n_out`` where both widths are given, an
    ``offset`` equal to the parameters before it (the flat gradient's layout), and ``forward_s`` /
    ``backward_s`` in seconds; the other times finite and >= 0; every codec's ``args`` an object,
    ``transport`` one of allreduce, allgather, allgatherv, ``payload_bytes`` a non-empty list of byte
    counts and its times in seconds.

    Raises
    ------
    ValueError
        One line naming the first field out of its range (``layers[2].params``, ``codecs.topk.payload_bytes``).

    Examples
    --------
    >>> check(synthetic([4, 8, 2], rows=10, flops_per_s=1e6)).elements
    58
    >>> p = synthetic([4, 8, 2], rows=10, flops_per_s=1e6)
    >>> p.layers[1]["params"] = 17
    >>> check(p)
    Traceback (most recent call last):
    ...
    ValueError: profile field layers[1].params is 17, but a layer of 8 inputs and 2 outputs holds 8 x 2 + 2 = 18
    """
    _count("rows", profile.rows, 1, _MAX_ROWS)
    if profile.itemsize not in (2, 4, 8) or isinstance(profile.itemsize, bool):
        raise ValueError(f"profile field itemsize must be 2, 4 or 8 (bytes per gradient element), got {profile.itemsize!r}")
    if not isinstance(profile.layers, list) or not profile.layers:
        raise ValueError(f"profile field layers must be a non-empty list of layers, got {profile.layers!r}")
    offset = 0
    for i, layer in enumerate(profile.layers):
        at = f"layers[{i}]"
        if not isinstance(layer, dict):
            raise ValueError(f"profile field {at} must be an object, got {layer!r}")
        for key in ("params", "forward_s", "backward_s"):
            if key not in layer:
                raise ValueError(f"profile field {at}.{key} is missing")
        n = _count(f"{at}.params", layer["params"])
        if not isinstance(layer.get("kind", ""), str):
            raise ValueError(f"profile field {at}.kind must be a name, got {layer['kind']!r}")
        for key in ("n_in", "n_out"):
            if layer.get(key) is not None:
                _count(f"{at}.{key}", layer[key], 1)
        if layer.get("n_in") and layer.get("n_out"):
            a, b = layer["n_in"], layer["n_out"]
            if n not in (a * b + b, a * b):
                raise ValueError(f"profile field {at}.params is {n}, but a layer of {a} inputs and {b} outputs holds "
                                 f"{a} x {b} + {b} = {a * b + b}")
        if n and layer.get("offset") is not None and _count(f"{at}.offset", layer["offset"]) != offset:
            raise ValueError(f"profile field {at}.offset is {layer['offset']}, but the layers before it hold {offset} "
                             "parameters")
        if n and layer.get("offset") is None:
            raise ValueError(f"profile field {at}.offset is missing (the layer holds {n} parameters)")
        offset += n
        _number(f"{at}.forward_s", layer["forward_s"])
        _number(f"{at}.backward_s", layer["backward_s"])
    if offset < 1 or offset > _MAX_ELEMENTS:
        raise ValueError(f"profile field layers holds {offset} parameters in all; a model needs 1 to {_MAX_ELEMENTS}")
    for key in ("optimizer_s", "extra_forward_s", "extra_backward_s"):
        _number(key, getattr(profile, key))
    _number("reduce_s_per_byte", profile.reduce_s_per_byte, 0.0, 1.0)
    if not isinstance(profile.codecs, dict):
        raise ValueError(f"profile field codecs must be an object (codec -> its measurement), got {profile.codecs!r}")
    for name, codec in profile.codecs.items():
        at = f"codecs.{name}"
        if not isinstance(codec, dict):
            raise ValueError(f"profile field {at} must be an object, got {codec!r}")
        for key in ("compress_s", "decompress_s"):
            _number(f"{at}.{key}", codec.get(key))
        if name == "traced":  # the trace's own compress/decompress times: no payload
            continue
        if not isinstance(codec.get("args", {}), dict):
            raise ValueError(f"profile field {at}.args must be an object, got {codec['args']!r}")
        if codec.get("transport") not in _TRANSPORTS:
            raise ValueError(f"profile field {at}.transport must be one of {', '.join(_TRANSPORTS)}, "
                             f"got {codec.get('transport')!r}")
        sizes = codec.get("payload_bytes")
        if not isinstance(sizes, list) or not sizes:
            raise ValueError(f"profile field {at}.payload_bytes must be a non-empty list of byte counts, got {sizes!r}")
        for j, nb in enumerate(sizes):
            _count(f"{at}.payload_bytes[{j}]", nb)
        if codec.get("reduce_s_per_byte") is not None:
            _number(f"{at}.reduce_s_per_byte", codec["reduce_s_per_byte"], 0.0, 1.0)
    if not isinstance(profile.source, str):
        raise ValueError(f"profile field source must be text, got {profile.source!r}")
    return profile


def codec_key(name, args):
    """Return the profile's key of compressor ``name`` with ``args``: ``name`` alone for its defaults,
    else ``name:K=V,...`` with the arguments that differ from the defaults, sorted.

    Examples
    --------
    >>> codec_key("topk", {"ratio": 0.5}), codec_key("topk", {}), codec_key("fp16", {})
    ('topk:ratio=0.5', 'topk', 'fp16')
    """
    full = _effective(name, args)
    defaults = _effective(name, {})
    changed = {k: v for k, v in sorted(full.items()) if defaults.get(k, object()) != v}
    return name if not changed else name + ":" + ",".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                                         for k, v in changed.items())


def _effective(name, args):
    """Every keyword argument compressor ``name`` takes, its default or as ``args`` sets it (``shapes`` left out:
    the profile's own)."""
    import inspect

    from collectives.compression.catalog import COMPRESSORS

    params = inspect.signature(COMPRESSORS[name]).parameters if name in COMPRESSORS else {}
    out = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
    out.update(args or {})
    out.pop("shapes", None)
    return out


def find_codec(profile, name, args):
    """Return the profile's measurement of compressor ``name`` with ``args`` (defaults filled in).

    Raises
    ------
    ValueError
        The profile holds no measurement of that compressor with those arguments (naming the ones it
        holds and the ``--codec`` that would measure it).
    """
    want = _effective(name, args)
    for key, codec in profile.codecs.items():
        if key.partition(":")[0] == name and _effective(name, codec.get("args") or {}) == want:
            return codec
    held = [k for k in profile.codecs if k.partition(":")[0] == name]
    spec = codec_key(name, args)
    raise ValueError(f"config field 'compression': the profile has no codec {spec!r}"
                     + (f" (it holds {', '.join(held)})" if held else "")
                     + f"; profile it with --codec {spec}")


def _median(xs):
    return float(statistics.median(xs)) if xs else 0.0


def from_trace(path, rank=None, skip=1):
    """Derive a :class:`Profile` from a Chrome trace of ``training.train --trace``.

    Parameters
    ----------
    path : str
        The trace file.
    rank : int, optional
        The rank (``pid``) to read; default the lowest one with ``layer`` events.
    skip : int
        Steps at the start left out (warm-up).

    Returns
    -------
    Profile

    Raises
    ------
    ValueError
        The file holds no ``layer`` events (a trace from before per-layer events, or of a grid
        run), or no step after ``skip``.
    """
    try:
        return _from_trace(path, rank, skip)
    except (KeyError, TypeError, IndexError, AttributeError) as e:  # an event without the fields the trainer writes
        raise ValueError(f"{path}: not a trace of training.train --trace ({type(e).__name__}: {e})") from None


def _from_trace(path, rank, skip):
    doc = read_json(path)
    listed = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(listed, list) or not listed:
        raise ValueError(f"{path}: no trace events (a Chrome trace of training.train --trace: an object whose "
                         "'traceEvents' is a non-empty list)")
    events = [e for e in listed if isinstance(e, dict) and e.get("ph") == "X"]
    if any(not isinstance(e.get("pid"), int) or not isinstance(e.get("ts"), (int, float)) or not isinstance(
            e.get("dur"), (int, float)) or not isinstance(e.get("name"), str) for e in events):
        raise ValueError(f"{path}: a complete event ('ph': 'X') lacks its name, pid, ts or dur")
    pids = sorted({e["pid"] for e in events if e["name"] == "layer"})
    if not pids:
        raise ValueError(f"{path}: no 'layer' events; trace a data-parallel run of training.train (--trace)")
    pid = pids[0] if rank is None else rank
    mine = sorted((e for e in events if e["pid"] == pid), key=lambda e: e["ts"])
    steps = [e for e in mine if e["name"] == "step" and not (e.get("args") or {}).get("skipped")][skip:]
    if not steps:
        raise ValueError(f"{path}: rank {pid} has no step after the first {skip}")
    per = {}  # name or (layer, direction) -> list of per-step seconds
    meta = {}
    for st in steps:
        lo, hi = st["ts"], st["ts"] + st["dur"]
        inside = [e for e in mine if lo <= e["ts"] <= hi and e is not st]
        sums = {}
        for e in inside:
            a = e.get("args") or {}
            key = (a["layer"], a["direction"]) if e["name"] == "layer" else e["name"]
            sums[key] = sums.get(key, 0.0) + e["dur"] * 1e-6
            if e["name"] == "layer":
                meta[a["layer"]] = a
        for key, v in sums.items():
            per.setdefault(key, []).append(v)
    n_layers = max(meta) + 1
    layers, rows, itemsize = [], meta[0]["rows"], meta[0]["itemsize"]
    for i in range(n_layers):
        a = meta.get(i, {})
        layers.append({"kind": a.get("kind", "?"), "params": a.get("params", 0), "offset": a.get("offset"),
                       "n_in": a.get("n_in"), "n_out": a.get("n_out"),
                       "forward_s": _median(per.get((i, "forward"), [])),
                       "backward_s": _median(per.get((i, "backward"), []))})
    fwd = sum(layer["forward_s"] for layer in layers)
    bwd = sum(layer["backward_s"] for layer in layers)
    codecs = {}
    if per.get("compress") or per.get("decompress"):
        codecs["traced"] = {"compress_s": _median(per.get("compress", [])),
                            "decompress_s": _median(per.get("decompress", []))}
    try:
        return check(Profile(rows=int(rows), itemsize=int(itemsize), layers=layers,
                             optimizer_s=_median(per.get("optimizer", [])),
                             extra_forward_s=max(0.0, _median(per.get("forward", [])) - fwd),
                             extra_backward_s=max(0.0, _median(per.get("backward", [])) - bwd), codecs=codecs,
                             source=f"{path} rank {pid}, median of {len(steps)} steps"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def synthetic(sizes, rows, flops_per_s, itemsize=4, optimizer_bytes_per_s=None):
    """Return the profile of an MLP over widths ``sizes`` on a device of ``flops_per_s``, from FLOP counts.

    A ``Linear(n_in, n_out)`` on ``rows`` rows costs ``2 rows n_in n_out`` FLOPs forward and twice that
    backward (Kaplan et al., "Scaling laws for neural language models", 2020, section 2.1); the
    optimizer streams the parameters, gradients and two moments at ``optimizer_bytes_per_s``
    (default 100 x ``flops_per_s`` / 1e3 bytes per second). Used by the at-scale study and the tests.

    Examples
    --------
    >>> p = synthetic([4, 8, 2], rows=10, flops_per_s=1e6)
    >>> [layer["forward_s"] for layer in p.layers], p.elements
    ([0.00064, 0.00032], 58)
    """
    layers, off = [], 0
    for a, b in zip(sizes[:-1], sizes[1:]):
        fl = 2.0 * rows * a * b
        n = a * b + b
        layers.append({"kind": "Linear", "params": n, "offset": off, "n_in": a, "n_out": b,
                       "forward_s": fl / flops_per_s, "backward_s": 2 * fl / flops_per_s})
        off += n
    rate = optimizer_bytes_per_s or flops_per_s / 10.0
    return Profile(rows=int(rows), itemsize=itemsize, layers=layers, optimizer_s=4 * off * itemsize / rate,
                   source=f"synthetic MLP {list(sizes)}, {rows} rows, {flops_per_s:g} FLOP/s")


def _shapes(profile):
    out = []
    for layer in profile.layers:
        if layer.get("n_in") and layer.get("n_out"):
            out += [(layer["n_in"], layer["n_out"]), (layer["n_out"],)]
        elif layer["params"]:
            out.append((layer["params"],))
    return out


def gradient_rms(checkpoint):
    """Return each gradient element's RMS over a run's steps, from its checkpoint's Adam second moment.

    Adam keeps ``v``, the exponential average of the squared gradient (Kingma and Ba, ICLR 2015,
    algorithm 1); ``sqrt(v / (1 - beta2 ** t))`` after ``t`` steps is the per-element RMS, with
    ``beta2`` from the checkpoint's own configuration.

    Returns
    -------
    ndarray, shape (parameters,), float32

    Raises
    ------
    ValueError
        The checkpoint holds no Adam state (``optim/v``).
    """
    with numpy.load(checkpoint, allow_pickle=False) as z:
        if "optim/v" not in z.files:
            raise ValueError(f"{checkpoint}: no Adam second moment (optim/v) to take the gradient's scale from")
        cfg = json.loads(bytes(z["meta/config"]).decode()) if "meta/config" in z.files else {}
        t = max(1, int(z["optim/steps"])) if "optim/steps" in z.files else 1
        v = z["optim/v"].astype(numpy.float64)
    return numpy.sqrt(v / (1 - float(cfg.get("beta2", 0.999)) ** t)).astype(numpy.float32)


def measure_codecs(profile, specs, repeats=5, seed=0, scale=None):
    """Time each compressor on a random gradient of the profile's size; add them to ``profile.codecs``.

    Parameters
    ----------
    profile : Profile
    specs : list of (str, dict)
        Compressor names (keys of ``collectives.compression.COMPRESSORS``) and their arguments.
    repeats : int
        Runs per compressor; the least is kept (the first run, which builds state, is left out).
        Times are CPU seconds of this process (``time.process_time``, BLAS held to one thread where
        threadpoolctl is installed): one rank's own work, which other processes on a busy machine
        do not lengthen.
    scale : ndarray of shape (profile.elements,) or float, optional
        Each element's RMS (:func:`gradient_rms`): the gradient is standard normal times it, so codecs
        whose time depends on the values' magnitude (fp16's casts of values below float16's normal
        range) are timed on what a step hands them. Default 1.

    Returns
    -------
    Profile
        ``profile``, its ``codecs`` and ``reduce_s_per_byte`` filled in.
    """
    from collectives.compression.base import payload_nbytes
    from collectives.compression.catalog import make_compressor
    rng = numpy.random.default_rng(seed)
    dtype = numpy.float32 if profile.itemsize == 4 else numpy.float64
    x = rng.standard_normal(profile.elements).astype(dtype)
    if scale is not None:
        x *= numpy.asarray(scale, dtype)
    with _one_thread():
        _time_codecs(profile, specs, x, repeats, "unit normal" if scale is None else "gradient scale")
    profile.reduce_s_per_byte = _add_speed(numpy.ones(1 << 21, numpy.float32))
    return profile


def _one_thread():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1)


def _time_codecs(profile, specs, x, repeats, label):
    from collectives.compression.base import payload_nbytes
    from collectives.compression.catalog import make_compressor
    clock = time.process_time
    for name, args in specs:
        kw = dict(args)
        if name == "powersgd":
            kw.setdefault("shapes", _shapes(profile))
        comp = make_compressor(name, **kw)
        comp_t, dec_t, sizes = [], [], []
        for _ in range(repeats + 1):
            t0 = clock()
            payloads, ctx = comp.compress(x, "grad")
            t1 = clock()
            comp.decompress(payloads, ctx)
            comp_t.append(t1 - t0)
            dec_t.append(clock() - t1)
            sizes = [payload_nbytes([p]) for p in payloads]
        transport = getattr(comp, "transport", "allreduce")
        key = codec_key(name, args)  # one entry per setting: topk at ratio 0.5 and at 0.01 both kept
        profile.codecs[key] = {"args": args, "transport": transport,
                               "payload_bytes": sizes, "compress_s": min(comp_t[1:]),
                               "decompress_s": min(dec_t[1:])}
        profile.codecs[key]["input"] = label
        if transport == "allreduce" and payloads:  # the all-reduce adds the payloads in their own dtype
            profile.codecs[key]["reduce_s_per_byte"] = _add_speed(payloads[0])


def _add_speed(b):
    """CPU seconds per byte of ``numpy.add(a, b, out=a)`` with ``a`` a copy of the 1-D array ``b`` (least of 5)."""
    a = b.copy()
    ts = []
    for _ in range(5):
        a[...] = b
        t0 = time.process_time()
        numpy.add(a, b, out=a)
        ts.append(time.process_time() - t0)
    return min(ts) / max(1, a.nbytes)


def parse_codec(text):
    """Read ``NAME`` or ``NAME:K=V,K=V`` into ``(name, {K: V})`` (values as command-line literals)."""
    from collectives.compression.catalog import parse_literal
    name, _, rest = text.partition(":")
    args = {}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        args[k.strip()] = parse_literal(v.strip())
    return name.strip(), args


def main(argv=None):
    p = Parser(prog="python -m training.predict.profile", description=__doc__.split("\n")[0])
    p.add_argument("--trace", type=text(), required=True, help="Chrome trace of training.train --trace")
    p.add_argument("--rank", type=integer(0, INT32_MAX), default=None, help="rank whose events are read (default the first)")
    p.add_argument("--skip", type=integer(0, INT32_MAX), default=1, help="steps left out at the start (default 1)")
    p.add_argument("--codec", type=text(), action="append", default=[], help="compressor to time, NAME[:K=V,...] (repeatable)")
    p.add_argument("--gradient-from", type=text(), default=None, help="checkpoint (ckpt-epochNNNN.npz, Adam) whose gradient "
                   "scale the codecs are timed at (default: unit normal values)")
    p.add_argument("--out", type=outpath(empty=True), required=True, help="profile JSON file to write")
    args = p.parse_args(argv)
    try:
        scale = gradient_rms(args.gradient_from) if args.gradient_from else None
        prof = measure_codecs(from_trace(args.trace, args.rank, args.skip), [parse_codec(c) for c in args.codec],
                              scale=scale)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(prof.to_dict(), f, indent=1)
    print(f"profile: {len(prof.layers)} layers, {prof.elements} parameters, {prof.rows} rows; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
