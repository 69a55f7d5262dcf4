"""HTTP endpoint on the front rank, on the standard library's ``http.server.ThreadingHTTPServer``.

Routes (JSON in and out):

- ``POST /predict`` with ``{"features": [f1, ..., fF]}`` -> 200 ``{"id", "prediction", "logits",
  "latency_ms"}``; a malformed body or bad features -> 400 ``{"error"}``; a request no replica
  could answer -> 503 ``{"error"}``; after shutdown began -> 503.
- ``GET /health`` -> 200 ``{"status": "serving" | "draining", "in_flight": N, "accepted": M}`` (N:
  requests accepted and not yet answered; M: requests accepted since the start).
- ``POST /shutdown`` -> 202: stop accepting, answer everything in flight, then the job ends.

Handler threads never call MPI: they hand each request to the front loop (the main thread) through
a queue and wait for its answer on an event.
"""
import http.server
import json
import queue
import threading
import time

from inference.request import Request

__all__ = ["HttpEndpoint"]


class _Handler(http.server.BaseHTTPRequestHandler):
    endpoint = None  # set per server class

    def log_message(self, fmt, *args):  # keep the job's output clean
        pass

    def _reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/health":
            return self._reply(404, {"error": f"no route GET {self.path}"})
        self._reply(200, {"status": "draining" if self.endpoint.closing else "serving",
                          "in_flight": self.endpoint.in_flight, "accepted": self.endpoint.accepted})

    def do_POST(self):
        ep = self.endpoint
        if self.path == "/shutdown":
            ep.close()
            return self._reply(202, {"status": "draining"})
        if self.path != "/predict":
            return self._reply(404, {"error": f"no route POST {self.path}"})
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            return self._reply(400, {"error": f"body is not JSON: {e}"})
        if not isinstance(body, dict) or "features" not in body:
            return self._reply(400, {"error": 'body must be an object {"features": [...]}'})
        req = ep.submit(body["features"])
        if req is None:
            return self._reply(503, {"error": "server is shutting down"})
        if not req.event.wait(ep.answer_timeout):
            return self._reply(504, {"error": f"no answer within {ep.answer_timeout} s"})
        req = req.request
        if req.status == "ok":
            return self._reply(200, {"id": req.rid, "prediction": int(req.logits.argmax()),
                                     "logits": req.logits.tolist(), "latency_ms": req.latency * 1e3})
        self._reply(400 if req.status == "rejected" else 503, {"id": req.rid, "error": req.error})


class _Waiting:
    __slots__ = ("request", "event")

    def __init__(self, request):
        self.request, self.event = request, threading.Event()


class HttpEndpoint:
    """A threaded HTTP server feeding requests to the front loop.

    Parameters
    ----------
    host : str
        Address to bind (``127.0.0.1`` keeps it local).
    port : int
        TCP port, 0 for any free one (see :attr:`port`).
    answer_timeout : float
        Seconds a handler waits for its answer before replying 504.

    Attributes
    ----------
    port : int
        The bound port.
    closing : bool
        True once shutdown began; no new request is accepted after that.
    in_flight : int
        Requests accepted and not yet answered.
    accepted : int
        Requests accepted since the start.
    """

    def __init__(self, host="127.0.0.1", port=0, answer_timeout=60.0):
        handler = type("Handler", (_Handler,), {"endpoint": self})
        self._server = http.server.ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_address[1]
        self.answer_timeout, self.closing = float(answer_timeout), False
        self._inbox, self._lock, self._count, self.in_flight = queue.Queue(), threading.Lock(), 0, 0
        self.accepted = 0
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def submit(self, features):
        """Queue a request for the front loop (handler threads); None once shutdown began."""
        with self._lock:
            if self.closing:
                return None
            w = _Waiting(None)
            w.request = Request(self._count, features, time.perf_counter(), done=lambda r, w=w: self._done(w))
            self._count += 1
            self.in_flight += 1
            self.accepted += 1
            self._inbox.put(w)
        return w

    def _done(self, waiting):
        with self._lock:
            self.in_flight -= 1
        waiting.event.set()

    def take(self):
        """Return the requests queued since the last call (front loop)."""
        out = []
        while True:
            try:
                out.append(self._inbox.get_nowait().request)
            except queue.Empty:
                return out

    def close(self):
        """Stop accepting requests (those already queued are still answered)."""
        with self._lock:
            self.closing = True

    def idle(self):
        """Return True once closing and nothing is left in the queue."""
        with self._lock:
            return self.closing and self._inbox.empty()

    def stop(self):
        """Shut the HTTP server down (after the front has drained)."""
        self._server.shutdown()
        self._server.server_close()
