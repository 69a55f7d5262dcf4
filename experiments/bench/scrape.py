"""A Prometheus-like scraper in a process of its own: fetch a metrics page at a fixed interval.

``python -m experiments.bench.scrape --port PORT [--every 0.5] [--host 127.0.0.1] [--count N]``

It reads ``http://HOST:PORT/metrics`` every ``--every`` seconds until it gets SIGTERM or SIGINT
(or has read ``--count`` pages), then prints one line, ``scrapes N failed M`` (M: refused or failed fetches, e.g. before the job's
endpoint is up), and exits 0. :mod:`experiments.bench.metrics_overhead` runs it beside a served
run, so that the scrapes load the served rank's HTTP thread as a Prometheus server does, from
another process, and not the rank's own interpreter. It imports neither MPI nor NumPy.
"""
import signal
import sys
import threading
import urllib.request
from training.settings.options import INT32_MAX, Parser, integer, real, text

__all__ = ["main", "scrape"]


def scrape(url, every, stop, count=0):
    """Fetch ``url`` every ``every`` seconds until ``stop`` is set; return (pages read, fetches failed).

    Parameters
    ----------
    url : str
        The metrics page.
    every : float
        Seconds between the starts of two fetches' waits.
    stop : threading.Event
        Set to end the loop.
    count : int
        Pages after which the loop ends by itself; 0: none.

    Returns
    -------
    tuple of int

    Examples
    --------
    >>> stop = threading.Event(); stop.set()
    >>> scrape("http://127.0.0.1:1/metrics", 0.5, stop)
    (0, 0)
    """
    done = failed = 0
    while not stop.wait(every):
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                r.read()
            done += 1
        except OSError:
            failed += 1
        if done == count:
            break
    return done, failed


def main(argv=None):
    """Scrape until SIGTERM or SIGINT; print ``scrapes N failed M``; return 0."""
    p = Parser(prog="python -m experiments.bench.scrape", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=integer(0, INT32_MAX), required=True, help="the metrics endpoint's TCP port")
    p.add_argument("--host", type=text(), default="127.0.0.1", help="its address (default: %(default)s)")
    p.add_argument("--every", type=real(0, 1e15, low_open=True), default=0.5, help="seconds between scrapes (default: %(default)s)")
    p.add_argument("--count", type=integer(0, INT32_MAX), default=0, help="stop after this many pages; 0: at the signal (default)")
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    done, failed = scrape(f"http://{args.host}:{args.port}/metrics", args.every, stop, args.count)
    print(f"scrapes {done} failed {failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
