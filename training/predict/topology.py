"""Topology files: a cluster's three levels, read into :class:`collectives.model.network.Network`.

Format (JSON; every field but the layout has a default)::

    {"name": "25 GbE, 8 GPUs per node",
     "racks": 8, "nodes_per_rack": 16, "ranks_per_node": 8,
     "levels": {"intra-node": {"latency_us": 2.0, "bandwidth_bps": 2.4e12},
                "inter-node": {"latency_us": 5.0, "bandwidth_bps": 25e9},
                "inter-rack": {"latency_us": 7.0, "bandwidth_bps": 100e9}},
     "reduce_bps": 8e12, "cpu_s_per_byte": 0.0, "duplex": 1.0, "cores": 0, "ranks_per_host": 0,
     "round_us": 0.0, "compute_scale": 1.0}

``levels`` are the emulator's ``--calibrate`` summary names: ``latency_us`` is one message's one-way
latency at that level and ``bandwidth_bps`` one flow's rate in bits per second (for ``inter-rack``,
the uplink's; the node link's rate still bounds a flow that crosses racks). ``reduce_bps`` is the
reduction speed in bits per second (default: the profile's measured one). ``duplex`` is a link's rate
in one direction while its other direction also carries data, as a fraction of its one-way rate (in
(0, 1]; 1, the default, is a full-duplex link; :class:`collectives.model.network.Network`).
``fanout`` (optional, ``[{"bytes": B, "fractions": [f1, ..., 1.0]}, ...]``) says how a node link
divides among messages it sends at once to other nodes: per message size B, the sorted ends of that
many messages as fractions of the last one's end, each in (0, 1], non-decreasing, the last 1
(measured by the emulator's calibration; without it they share the link evenly and end together;
:mod:`training.predict.ps_step` applies it to a parameter server's replies). ``cores`` and
``ranks_per_host`` give the oversubscription of a host (ranks waiting for a core,
:attr:`Network.oversubscription`), which slows both computation and copies; ``compute_scale``
multiplies the profile's compute times (a faster device: < 1). ``round_us`` is the least time one
round of a collective takes on a host, in microseconds, whatever its bytes (0: none; an emulated
cluster's comes from :mod:`training.predict.floor`, fitted at the host's ranks per core). A bad
field is one :class:`ValueError` line naming it.

    python -m training.predict.topology --calibration CAL.json --racks R --nodes N --ranks-per-node K \\
        [--cores C] --out TOPO.json

writes the topology of an emulated cluster from its ``--calibrate`` file (the latency of a level
above the node's is its extra: ``alpha_rack`` = inter-rack minus inter-node latency); ``--round-us``
sets its ``round_us``.
"""
import json
import math
import os
import sys

from training.predict.message_times import HostNetwork
from training.predict.files import read_json
from training.settings.options import INT32_MAX, Parser, integer, outpath, real, text

__all__ = ["Topology", "parse", "load", "from_calibration", "main"]

LEVELS = ("intra-node", "inter-node", "inter-rack")
_DEFAULTS = {"intra-node": (1.0, 80e9), "inter-node": (30.0, 1e9), "inter-rack": (30.0, 1e9)}
#: Most ranks a topology may hold: the replay keeps a clock per rank and a schedule's rounds per rank.
MAX_RANKS = 2 ** 20

_KEYS = ("name", "racks", "nodes_per_rack", "ranks_per_node", "levels", "reduce_bps", "cpu_s_per_byte", "duplex",
         "cores", "ranks_per_host", "round_us", "compute_scale", "fanout", "source")


class Topology:
    """A parsed topology file: the :class:`Network` and what the step simulator adds to it.

    Attributes
    ----------
    name : str
    net : training.predict.message_times.HostNetwork
        Its ``gamma`` is 0 when the file gives no ``reduce_bps`` (the profile's is used then).
    compute_scale : float
        Factor on the profile's compute times.
    reduce_given : bool
        Whether the file set the reduction speed.
    fanout : list of dict or None
        The checked ``fanout`` (``[{"bytes": float, "fractions": [float, ...]}]``), None without one.
    """

    __slots__ = ("name", "net", "compute_scale", "reduce_given", "doc", "fanout")

    def __init__(self, name, net, compute_scale, reduce_given, doc, fanout=None):
        self.name, self.net, self.compute_scale = name, net, compute_scale
        self.reduce_given, self.doc, self.fanout = reduce_given, doc, fanout

    def with_gamma(self, gamma):
        """Return the Network with ``gamma`` (seconds per byte) unless the file gave its own."""
        if self.reduce_given:
            return self.net
        return HostNetwork(**{**_net_fields(self.net), "gamma": gamma})


def _net_fields(net):
    return {k: getattr(net, k) for k in net.__dataclass_fields__}


def _number(doc, key, where, positive=False, integer=False, default=None):
    v = doc.get(key, default)
    label = f"{where}{key}"
    if v is None:
        raise ValueError(f"topology field {label!r} is missing")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or (integer and int(v) != v):
        raise ValueError(f"topology field {label!r} must be {'an integer' if integer else 'a finite number'}, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise ValueError(f"topology field {label!r} must be {'> 0' if positive else '>= 0'}, got {v!r}")
    return int(v) if integer else float(v)


def _finite(v):
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer beyond a float's range
        return False


def parse(doc):
    """Check a topology document (dict) and return its :class:`Topology`.

    Raises
    ------
    ValueError
        One line naming the first bad field (unknown, missing, wrong type or out of range).

    Examples
    --------
    >>> t = parse({"racks": 1, "nodes_per_rack": 2, "ranks_per_node": 4,
    ...            "levels": {"inter-node": {"latency_us": 50, "bandwidth_bps": 1e9}}})
    >>> t.net.size, round(t.net.alpha_node * 1e6, 6), t.net.beta_node  # 50 us, 8 ns per byte
    (8, 50.0, 8e-09)
    >>> parse({"racks": 1, "nodes_per_rack": 2, "ranks_per_node": 0})
    Traceback (most recent call last):
    ...
    ValueError: topology field 'ranks_per_node' must be > 0, got 0
    """
    if not isinstance(doc, dict):
        raise ValueError(f"a topology file holds one JSON object, got {type(doc).__name__}")
    for key in doc:
        if key not in _KEYS:
            raise ValueError(f"topology field {key!r} is unknown; accepted: {', '.join(_KEYS)}")
    racks = _number(doc, "racks", "", True, True, 1)
    npr = _number(doc, "nodes_per_rack", "", True, True)
    rpn = _number(doc, "ranks_per_node", "", True, True)
    if racks * npr * rpn > MAX_RANKS:
        raise ValueError(f"topology fields racks x nodes_per_rack x ranks_per_node make {racks * npr * rpn:,} ranks; "
                         f"the predictor replays at most {MAX_RANKS:,} (each rank's clock is kept)")
    levels = doc.get("levels", {})
    if not isinstance(levels, dict):
        raise ValueError(f"topology field 'levels' must be an object of {', '.join(LEVELS)}, got {levels!r}")
    got = {}
    for name in levels:
        if name not in LEVELS:
            raise ValueError(f"topology field 'levels.{name}' is unknown; accepted: {', '.join(LEVELS)}")
    for name in LEVELS:
        lv = levels.get(name, {})
        if not isinstance(lv, dict):
            raise ValueError(f"topology field 'levels.{name}' must be an object, got {lv!r}")
        for k in lv:
            if k not in ("latency_us", "bandwidth_bps"):
                raise ValueError(f"topology field 'levels.{name}.{k}' is unknown; accepted: latency_us, bandwidth_bps")
        lat = _number(lv, "latency_us", f"levels.{name}.", default=_DEFAULTS[name][0])
        bw = _number(lv, "bandwidth_bps", f"levels.{name}.", positive=True, default=_DEFAULTS[name][1])
        got[name] = (lat * 1e-6, 8.0 / bw)
    reduce_bps = doc.get("reduce_bps")
    gamma = 8.0 / _number(doc, "reduce_bps", "", positive=True) if reduce_bps is not None else 0.0
    net = HostNetwork(racks=racks, nodes_per_rack=npr, ranks_per_node=rpn,
                  alpha_intra=got["intra-node"][0], beta_intra=got["intra-node"][1],
                  alpha_node=got["inter-node"][0], beta_node=got["inter-node"][1],
                  alpha_rack=max(0.0, got["inter-rack"][0] - got["inter-node"][0]), beta_rack=got["inter-rack"][1],
                  gamma=gamma, cpu=_number(doc, "cpu_s_per_byte", "", default=0.0), duplex=_duplex(doc),
                  cores=_number(doc, "cores", "", integer=True, default=0),
                  ranks_per_host=_number(doc, "ranks_per_host", "", integer=True, default=0),
                  round_s=_number(doc, "round_us", "", default=0.0) * 1e-6)
    scale = _number(doc, "compute_scale", "", positive=True, default=1.0)
    name = doc.get("name", f"{racks}x{npr}x{rpn}")
    if not isinstance(name, str):
        raise ValueError(f"topology field 'name' must be a string, got {name!r}")
    return Topology(name, net, scale, reduce_bps is not None, doc, _fanout(doc))


def _fanout(doc):
    fo = doc.get("fanout")
    if fo is None:
        return None
    if not isinstance(fo, list) or not fo:
        raise ValueError(f"topology field 'fanout' must be a non-empty list of {{bytes, fractions}}, got {fo!r}")
    out, count = [], None
    for i, e in enumerate(fo):
        where = f"fanout[{i}]."
        if not isinstance(e, dict):
            raise ValueError(f"topology field 'fanout[{i}]' must be an object with bytes and fractions, got {e!r}")
        for key in e:
            if key not in ("bytes", "fractions"):
                raise ValueError(f"topology field '{where}{key}' is unknown; accepted: bytes, fractions")
        if "fractions" not in e:
            raise ValueError(f"topology field '{where}fractions' is missing")
        nbytes = _number(e, "bytes", where, positive=True)
        if any(nbytes == o["bytes"] for o in out):
            raise ValueError(f"topology field '{where}bytes' repeats an earlier size, {nbytes:g}")
        fr = e["fractions"]
        if not isinstance(fr, list) or not fr or (count is not None and len(fr) != count):
            raise ValueError(f"topology field '{where}fractions' must be a non-empty list"
                             f"{'' if count is None else f' of {count} (as fanout[0])'}, got {fr!r}")
        count = len(fr)
        vals = [_number({f"fractions[{j}]": v}, f"fractions[{j}]", where, positive=True) for j, v in enumerate(fr)]
        if any(b < a for a, b in zip(vals, vals[1:])) or vals[-1] != 1.0:
            raise ValueError(f"topology field '{where}fractions' must be non-decreasing and end at 1, got {fr!r}")
        out.append({"bytes": nbytes, "fractions": vals})
    return out


def _duplex(doc):
    d = _number(doc, "duplex", "", positive=True, default=1.0)
    if not d <= 1:  # NaN too
        raise ValueError(f"topology field 'duplex' must be <= 1 (a fraction of the one-way rate), got {d!r}")
    return d


def load(path):
    """Read and check a topology file (see :func:`parse`); a bad file is one line naming the path and field."""
    doc = read_json(path)
    try:
        return parse(doc)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def from_calibration(cal, racks, nodes_per_rack, ranks_per_node, cores=None, round_us=0.0):
    """Return a topology document for an emulated cluster from its ``--calibrate`` result (a dict).

    Every rank of the emulated cluster runs on this one host, so ``ranks_per_host`` is the whole job
    and ``cores`` the host's (default ``os.cpu_count()``); ``round_us`` is written as given, ``duplex``
    from the calibration's bidirectional test (``summary.duplex``, at most 1; 1 when it has none) and
    ``fanout`` from its fan-out test (``summary.fanout``; left out when it has none).

    Raises
    ------
    ValueError
        The calibration has no ``summary.levels``.
    """
    summary = cal.get("summary") or {}
    levels = summary.get("levels")
    if not levels:
        raise ValueError("calibration file has no summary.levels: run the emulator's --calibrate")
    out = {k: {"latency_us": float(v["latency_us"]), "bandwidth_bps": float(v["bandwidth_bps"])}
           for k, v in levels.items() if k in LEVELS}
    if "inter-rack" not in out and "inter-node" in out:
        out["inter-rack"] = dict(out["inter-node"])
    P = racks * nodes_per_rack * ranks_per_node
    doc = {"name": f"emulated {racks}x{nodes_per_rack}x{ranks_per_node}, {cal.get('config', {}).get('link', '?')}",
           "racks": racks, "nodes_per_rack": nodes_per_rack, "ranks_per_node": ranks_per_node, "levels": out,
           "cores": int(cores or os.cpu_count() or 1), "ranks_per_host": P, "round_us": float(round_us),
           "duplex": min(1.0, float(summary.get("duplex", 1.0))), "source": "emulator --calibrate"}
    sizes = {}  # the calibration's entries also say how many messages and repetitions; one per size
    for f in summary.get("fanout") or ():
        sizes.setdefault(int(f["bytes"]), [min(1.0, float(x)) for x in f["fractions"]])
    if sizes:
        doc["fanout"] = [{"bytes": b, "fractions": fr} for b, fr in sizes.items()]
    return doc


def main(argv=None):
    p = Parser(prog="python -m training.predict.topology",
                                description="write a topology file from an emulated cluster's --calibrate JSON")
    p.add_argument("--calibration", type=text(), required=True)
    p.add_argument("--racks", type=integer(1, INT32_MAX), default=1)
    p.add_argument("--nodes", type=integer(1, INT32_MAX), required=True, help="nodes per rack")
    p.add_argument("--ranks-per-node", type=integer(0, INT32_MAX), required=True)
    p.add_argument("--cores", type=integer(1, INT32_MAX), default=None, help="cores of the host (default this machine's)")
    p.add_argument("--round-us", type=real(0, 1e15), default=0.0, help="a round's least microseconds on the host "
                   "(python -m training.predict.floor prints it per ranks per core; default 0)")
    p.add_argument("--out", type=outpath(empty=True), required=True)
    a = p.parse_args(argv)
    try:
        with open(a.calibration, encoding="utf-8") as f:
            doc = from_calibration(json.load(f), a.racks, a.nodes, a.ranks_per_node, a.cores, a.round_us)
        parse(doc)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
