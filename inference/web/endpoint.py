"""The front's HTTP server: the Open Inference Protocol (V2) on Starlette, served by uvicorn.

Routes (:mod:`inference.web.open_inference` for the bodies):

- ``GET /v2`` server metadata; ``GET /v2/health/live`` 200 while the front loop runs;
  ``GET /v2/health/ready`` 200 while a replica can serve and the server is not draining, else 503;
- ``GET /v2/models/{name}`` model metadata, ``GET /v2/models/{name}/ready`` (also under
  ``/versions/1``); an unknown model 404;
- ``POST /v2/models/{name}/infer`` (also under ``/versions/1``): 200 with the outputs; 400 for a bad
  body or input, and for features whose logits overflow; 413 for a body over ``max_body_bytes``;
  408 for a body not complete within ``read_timeout`` seconds; 429 when the latency objective
  refuses it; 503 when the queue is full, more than ``max_connections`` connections are open, no
  replica can answer, or the server is draining;
- ``GET /metrics``: Prometheus text format (:mod:`inference.web.prometheus`).

Every error body is ``{"error": "..."}``. uvicorn runs in a thread with its own event loop; it never
calls MPI: a request's rows are handed to the front loop (the main thread) through a queue, and the
front's answer comes back to the event loop with ``call_soon_threadsafe``. What a client can make
the server hold is bounded: a body by ``max_body_bytes`` (read in chunks, stopped at the limit),
its arrival by ``read_timeout``, a request head's arrival by ``read_timeout`` too (the connection is
closed), the connections served at once by ``max_connections`` (a request on a connection beyond
them is answered 503 and its connection closed; :mod:`inference.web.connections`), headers by h11's
limit, and accepted requests by ``max_queue``. No route shuts the server down: the job ends on
SIGTERM or SIGINT, which drain (:func:`inference.serve.run`). The server's thread is watched: when
it ends before :meth:`HttpEndpoint.stop`, :meth:`HttpEndpoint.check` raises on the front loop.
"""
import asyncio
import queue
import socket
import threading
import time

import numpy
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Route

from inference.web.connections import bounded_protocol
from inference.web.prometheus import CONTENT_TYPE
from inference.web.open_inference import (ProtocolError, dumps, error_body, infer_response, model_metadata, parse_infer,
                                server_metadata)
from inference.request import Request

__all__ = ["HttpEndpoint", "EndpointOptions"]


def _plain_paths(app):
    """Wrap ASGI ``app``: a path holding an encoded '/' (``%2F``) is answered 400 before routing.

    The server decodes the path before the routes see it, so ``/v2/models/model%2Fready`` was the
    ready route and ``/v2/models/a%2Fb`` a model of another route's shape; model names and versions
    hold no '/', so no such path names anything.
    """
    async def plain(scope, receive, send):
        if scope["type"] == "http" and b"%2f" in scope.get("raw_path", b"").lower():
            body = error_body("an encoded '/' (%2F) in the path: model names and versions hold no '/'")
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return plain


class EndpointOptions:
    """Limits and names of the HTTP server (the ``ServeConfig`` fields of the same names)."""

    __slots__ = ("host", "port", "model", "max_body_bytes", "read_timeout", "max_connections", "max_queue",
                 "answer_timeout")

    def __init__(self, host="127.0.0.1", port=0, model="model", max_body_bytes=1 << 20, read_timeout=5.0,
                 max_connections=1024, max_queue=1024, answer_timeout=60.0):
        self.host, self.port, self.model = host, int(port), model
        self.max_body_bytes, self.read_timeout = int(max_body_bytes), float(read_timeout)
        self.max_connections, self.max_queue, self.answer_timeout = int(max_connections), int(max_queue), answer_timeout


def _json(code, obj):
    return Response(dumps(obj), code, media_type="application/json")


def _error(code, message):
    return Response(error_body(message), code, media_type="application/json")


class _Call:
    """One infer request on its way through the front: its rows' Requests and the future they resolve."""

    __slots__ = ("requests", "left", "future", "loop")

    def __init__(self, loop, n):
        self.loop, self.left, self.future, self.requests = loop, n, loop.create_future(), []

    def one_done(self):  # event loop thread
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(None)


class HttpEndpoint:
    """The HTTP server of the front rank.

    Parameters
    ----------
    options : EndpointOptions
    n_features, n_classes : int
    metrics : inference.web.prometheus.ServingMetrics

    Attributes
    ----------
    port : int
        The bound port.
    closing : bool
        True once shutdown began; no new request is accepted after that.
    replicas_alive : int
        Set by the front loop; readiness needs it above 0.
    heartbeat : float
        ``time.monotonic()`` of the front loop's last turn; liveness needs it recent.
    """

    def __init__(self, options, n_features, n_classes, metrics):
        self.opt, self.F, self.C, self.metrics = options, int(n_features), int(n_classes), metrics
        self.closing, self.replicas_alive, self.heartbeat = False, 1, time.monotonic()
        self._inbox, self._lock, self._held, self._count = queue.SimpleQueue(), threading.Lock(), 0, 0
        self._sock = socket.socket(socket.AF_INET6 if ":" in options.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((options.host, options.port))
            self._sock.listen(2048)
        except OSError as e:
            self._sock.close()
            raise OSError(f"cannot listen on {options.host} port {options.port} (--host, --http): "
                          f"{e.strerror or e}") from None
        self.host, self.port = options.host, self._sock.getsockname()[1]
        m = "/v2/models/{name}"
        routes = [Route("/v2", self._server_meta), Route("/v2/health/live", self._live),
                  Route("/v2/health/ready", self._ready), Route("/metrics", self._metrics)]
        for base in (m, m + "/versions/{version}"):
            routes += [Route(base, self._model_meta), Route(base + "/ready", self._model_ready),
                       Route(base + "/infer", self._infer, methods=["POST"])]
        app = _plain_paths(Starlette(routes=routes, exception_handlers={404: self._no_route, 405: self._no_route}))
        http = bounded_protocol(options.read_timeout, options.max_connections, self._busy)
        cfg = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", http=http,
                             timeout_keep_alive=5, backlog=2048)
        self._server, self._stopping, self._failure = uvicorn.Server(cfg), False, None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            time.sleep(0.01)
        self.check()

    def _run(self):  # the server's thread
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as e:  # noqa: BLE001 -- SystemExit too (uvicorn's failed start-up): check() reports it
            self._failure = e

    # -------------------------------------------------------------------------- the front loop
    def take(self):
        """Return the requests queued since the last call (front loop); beats the heartbeat."""
        self.heartbeat = time.monotonic()
        out = []
        while True:
            try:
                out.extend(self._inbox.get_nowait())
            except queue.Empty:
                return out

    def check(self):
        """Raise RuntimeError when the server's thread has ended before :meth:`stop` (nobody can reach the server)."""
        if not self._stopping and not self._thread.is_alive():
            e = self._failure
            why = f"{type(e).__name__}: {e}" if e is not None else "uvicorn's Server.run returned"
            raise RuntimeError(f"the HTTP server's thread ended ({why})")

    def close(self):
        """Stop accepting requests (those already accepted are still answered); readiness turns false."""
        self.closing = True

    def idle(self):
        """Return True once closing and nothing accepted is left unanswered."""
        with self._lock:
            return self.closing and self._held == 0

    def stop(self):
        """Shut the HTTP server down (after the front has drained)."""
        self._stopping = self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()

    # ----------------------------------------------------------------------------- the routes
    def _is_ready(self):
        return not self.closing and self.replicas_alive > 0

    async def _busy(self, scope, receive, send):  # ASGI: a request over --max-connections
        if scope["path"].endswith("/infer"):
            self.metrics.request("refused", 0.0)
        body = error_body(f"server busy: more than {self.opt.max_connections} connections open (--max-connections)")
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def _no_route(self, request, exc):
        return _error(exc.status_code, f"no route {request.method} {request.url.path[:100]}")

    async def _server_meta(self, request):
        return _json(200, server_metadata("0.1.0"))

    async def _live(self, request):
        live = time.monotonic() - self.heartbeat < 5.0
        return _json(200 if live else 503, {"live": live})

    async def _ready(self, request):
        return _json(200 if self._is_ready() else 503, {"ready": self._is_ready()})

    async def _metrics(self, request):
        return Response(self.metrics.text(), 200, media_type=CONTENT_TYPE)

    def _unknown(self, request):
        name, version = request.path_params["name"], request.path_params.get("version", "1")
        if name != self.opt.model or version != "1":
            return _error(404, f"unknown model {name!r} version {version!r}: this server has {self.opt.model!r} "
                               f"version '1'")
        return None

    async def _model_meta(self, request):
        return self._unknown(request) or _json(200, model_metadata(self.opt.model, self.F, self.C))

    async def _model_ready(self, request):
        return self._unknown(request) or _json(200 if self._is_ready() else 503,
                                               {"name": self.opt.model, "ready": self._is_ready()})

    async def _body(self, request):
        """Read the body within the size and time limits; raise ProtocolError (413, 408, 400)."""
        limit = self.opt.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise ProtocolError(f"body of {length[:20]} bytes is over the limit of {limit} bytes", 413)
        chunks, size = [], 0

        async def read():
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ProtocolError(f"body is over the limit of {limit} bytes", 413)
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), self.opt.read_timeout)
        except asyncio.TimeoutError:
            raise ProtocolError(f"body not complete within {self.opt.read_timeout:g} s (--read-timeout)", 408) from None
        return b"".join(chunks)

    async def _infer(self, request):
        bad = self._unknown(request)
        if bad:
            return bad
        if "inference-header-content-length" in request.headers:
            self.metrics.request("rejected", 0.0)
            return _error(400, "the binary-data extension is not supported: send inputs with binary_data=False")
        try:
            call = parse_infer(await self._body(request), self.F)
        except ProtocolError as e:
            self.metrics.request("rejected", 0.0)
            return _error(e.status, str(e))
        except ClientDisconnect:
            return _error(400, "client disconnected")  # never sent: nobody is listening
        n = call.rows.shape[0]
        loop = asyncio.get_running_loop()
        pending = _Call(loop, n)
        with self._lock:
            if self.closing:
                return _error(503, "server is shutting down")
            if self._held + n > self.opt.max_queue:
                self.metrics.request("refused", 0.0)
                return _error(503, f"server busy: {self._held} requests held (--max-queue {self.opt.max_queue})")
            now = time.perf_counter()
            for i in range(n):
                done = (lambda r, p=pending: p.loop.call_soon_threadsafe(p.one_done))
                pending.requests.append(Request(self._count, call.rows[i], now, done=done))
                self._count += 1
            self._held += n
            self._inbox.put(pending.requests)
        try:
            await asyncio.wait_for(asyncio.shield(pending.future), self.opt.answer_timeout)
        except asyncio.TimeoutError:
            return _error(504, f"no answer within {self.opt.answer_timeout:g} s")
        finally:
            with self._lock:
                self._held -= n  # the front answered every row (or will, and nobody waits for it)
        return self._answer(call, pending.requests)

    def _answer(self, call, reqs):
        for status, code in (("rejected", 400), ("refused", 429), ("failed", 503)):
            bad = [(i, r) for i, r in enumerate(reqs) if r.status == status]
            if bad:
                i, r = bad[0]
                where = f"row {i}: " if len(reqs) > 1 else ""
                return _error(code, where + r.error)
        logits = numpy.stack([r.logits for r in reqs])  # (n, C)
        return Response(infer_response(self.opt.model, call.id, logits, call.outputs), 200,
                        media_type="application/json")
