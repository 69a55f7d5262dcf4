"""Predict a training step: ``python -m training.predict --trace FILE --topology FILE --config ...``.

    python -m training.predict --trace run.trace.json --topology topo.json \\
        --config algorithm=torus grid=topology bucket_bytes=4194304 overlap=true [--json OUT]
    python -m training.predict --profile profile.json --topology topo.json --config configs.json

``--trace`` derives the job profile (:mod:`training.predict.profile`) and times the compressors the
configurations name on this machine; ``--profile`` reads one written before. ``--config`` is a JSON
file (one configuration or a list) or ``KEY=VALUE`` fields (:mod:`training.predict.job_config`).
Prints one table row per configuration (step time and its mean breakdown over ranks) and, with
``--ranks``, every class of ranks with its own breakdown; ``--json`` writes everything. A bad file
or field: one line on stderr, exit status 2.
"""
import json
import os
import sys

from training.predict import job_config as cfgmod
from training.predict import profile as profmod
from training.predict import topology as topomod
from training.predict.step import predict
from training.settings.options import INT32_MAX, Parser, infile, integer, text

__all__ = ["main", "load_inputs"]


def load_inputs(trace=None, profile=None, topology=None, configs=(), skip=1):
    """Return ``(profile, topology, [JobConfig])`` from the command's inputs; codecs timed as needed.

    Raises
    ------
    ValueError
        A bad file or field (one line).
    """
    if (trace is None) == (profile is None):
        raise ValueError("give exactly one of --trace and --profile")
    if len(configs) == 1 and "=" not in configs[0]:
        cfgs = cfgmod.load(configs[0])
    else:
        cfgs = [cfgmod.from_pairs(configs)]
    topo = topomod.load(topology)
    prof = profmod.from_trace(trace, skip=skip) if trace else profmod.load(profile)
    want = {profmod.codec_key(c.compression, c.compression_args): c for c in cfgs  # each setting its own payloads
            if c.compression != "none" and profmod.codec_key(c.compression, c.compression_args) not in prof.codecs}
    if want or (trace and not prof.reduce_s_per_byte):
        profmod.measure_codecs(prof, [(c.compression, c.compression_args) for c in want.values()])
    return prof, topo, cfgs


def main(argv=None):
    p = Parser(prog="python -m training.predict", description=__doc__.split("\n")[0])
    p.add_argument("--trace", type=infile(), help="Chrome trace of one short run of training.train --trace")
    p.add_argument("--profile", type=infile(), help="a profile JSON written by training.predict.profile (instead of --trace)")
    p.add_argument("--skip", type=integer(0, INT32_MAX), default=1, help="--trace: warm-up steps left out (default 1)")
    p.add_argument("--topology", type=infile(), required=True, help="topology JSON file (docs/guide/predict.md)")
    p.add_argument("--config", type=text(), nargs="+", required=True, help="configuration JSON file, or KEY=VALUE fields")
    p.add_argument("--ranks", action="store_true", help="print every class of ranks' breakdown")
    p.add_argument("--json", type=text(), default="", help="write the predictions to this JSON file")
    a = p.parse_args(argv)
    try:
        for path in (a.trace, a.profile, a.topology):
            if path and not os.path.exists(path):
                raise ValueError(f"{path}: no such file")
        prof, topo, cfgs = load_inputs(a.trace, a.profile, a.topology, a.config, a.skip)
        results = [predict(prof, topo, c) for c in cfgs]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{topo.name}: P={topo.net.size}; profile {prof.source}")
    print(f"{'configuration':<40}{'step ms':>10}{'compute':>10}{'comm':>10}{'bubble':>10}{'wait':>10}")
    for r in results:
        b = r["breakdown"]
        print(f"{r['config'][:39]:<40}{r['step_s'] * 1e3:>10.3f}" + "".join(f"{b[k] * 1e3:>10.3f}" for k in
                                                                          ("compute", "comm", "bubble", "wait")))
        if a.ranks:
            for c in r["ranks"]:
                print(f"  ranks {c['ranks'][:30]:<31}" + "".join(f"{c[k] * 1e3:>10.3f}" for k in
                                                                 ("compute", "comm", "bubble", "wait")))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"topology": topo.doc, "profile": prof.to_dict(), "predictions": results,
                       "configs": [c.to_dict() for c in cfgs]}, f, indent=1, default=list)
    return 0


if __name__ == "__main__":
    sys.exit(main())
