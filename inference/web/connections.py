"""uvicorn's HTTP/1.1 protocol (h11) with the front's two bounds on connections.

- **A deadline for the request head.** A connection whose next request head (request line and
  headers) has not fully arrived ``read_timeout`` seconds after the connection was made, or after
  the previous answer, is closed. uvicorn alone times out only an idle connection after an answer
  (``timeout_keep_alive``), and any byte that arrives cancels that: a client that connects and sends
  nothing, or sends a head a byte at a time, would hold its connection, and a place under the
  connection limit, for ever. Once the head is in, the body has its own deadline (the endpoint's
  408, also ``read_timeout``).
- **A limit on connections.** A request whose head arrives while more than ``max_connections``
  connections are open (its own included), or while ``max_connections`` requests are running, is
  answered by ``busy`` (the endpoint's 503 with a JSON error body and ``Connection: close``)
  instead of the application. uvicorn's own ``limit_concurrency`` check is switched off: it answers
  a plain-text 503, and already when exactly ``limit`` connections are open.

- **A bound on the request head.** A head (request line and headers, up to the blank line) of more
  than :data:`HEAD_BYTES` bytes or :data:`HEAD_LINES` lines is answered 431 (``Request Header Fields
  Too Large``) and its connection closed, however it arrives: h11's own limit (16 KiB) holds only
  while a head is incomplete, so a head that arrived in one read passed at any size. The close
  lingers: the answer and a FIN go out at once, and what the client still sends is read and dropped
  until it closes or ``read_timeout`` passes, so that a client still writing its head reads the 431
  instead of a connection reset.

A connection over the limit is still accepted by the kernel and by asyncio; it costs a protocol
object until its request is answered 503 or its head deadline passes.
"""
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["bounded_protocol", "HEAD_BYTES", "HEAD_LINES"]

#: Largest request head (request line and headers, the blank line left out), bytes and lines.
HEAD_BYTES, HEAD_LINES = 16384, 100

_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
              b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def bounded_protocol(read_timeout, max_connections, busy):
    """Return a protocol class for ``uvicorn.Config(http=...)`` with these bounds.

    Parameters
    ----------
    read_timeout : float
        Seconds a request head may take to arrive, counted from the connection or the previous answer.
    max_connections : int
        Open connections (and running requests) served at once, >= 1.
    busy : callable
        ASGI application that answers a request over the limit.

    Returns
    -------
    type
        A subclass of uvicorn's ``H11Protocol``.

    Raises
    ------
    ValueError
        When ``read_timeout`` is not > 0 or ``max_connections`` < 1.

    Examples
    --------
    >>> cls = bounded_protocol(2.0, 4, None)
    >>> cls.read_timeout, cls.max_connections, issubclass(cls, H11Protocol)
    (2.0, 4, True)
    """
    if not read_timeout > 0 or max_connections < 1:
        raise ValueError(f"read_timeout must be > 0 s and max_connections >= 1, got {read_timeout!r}, "
                         f"{max_connections!r}")
    return type("BoundedH11Protocol", (_Bounded,), {"read_timeout": float(read_timeout),
                                                    "max_connections": int(max_connections),
                                                    "busy": staticmethod(busy)})


class _Bounded(H11Protocol):
    read_timeout, max_connections, busy = 5.0, 1024, None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # checked in handle_events, answered by busy
        self._app, self._head_timer, self._head = self.app, None, bytearray()
        self._lingering = None  # the timer that ends a connection answered 431 (a lingering close)

    def _arm(self):
        self._disarm()
        self._head = bytearray()
        self._head_timer = self.loop.call_later(self.read_timeout, self._head_late)

    def _disarm(self):
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self):
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport):
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc):
        self._disarm()
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)

    def data_received(self, data):
        if self._lingering is not None:  # answered 431: what the client still sends is read and dropped
            return
        if self._head_timer is not None and self._head_over(data):  # a head is awaited: bounded here
            return
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a request head arrived (a new request-response cycle began)
            self._disarm()

    def _head_over(self, data):
        """Add ``data`` to the awaited head; answer 431 and close when it passes a bound. True then."""
        self._head += data[:HEAD_BYTES + 4 - len(self._head)]  # (no more is kept than the bound needs)
        end = self._head.find(b"\r\n\r\n")
        head = self._head if end < 0 else self._head[:end]
        if len(head) <= HEAD_BYTES and head.count(b"\n") < HEAD_LINES:
            return False
        self._disarm()
        body = (b'{"error":"request head over %d bytes or %d lines (request line and headers)"}'
                % (HEAD_BYTES, HEAD_LINES))
        if not self.transport.is_closing():
            self.transport.write(_TOO_LARGE % (len(body), body))
            # A lingering close (RFC 9112 section 9.6): the answer and then our FIN go out, and what
            # the client is still sending is read and dropped for up to read_timeout seconds. Closing
            # at once would reset a connection with unread bytes, and a client still writing its head
            # would get ECONNRESET instead of reading the 431.
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self._lingering = self.loop.call_later(self.read_timeout, self.transport.close)
            else:
                self.transport.close()
        return True

    def handle_events(self):
        full = len(self.connections) > self.max_connections or len(self.tasks) >= self.max_connections
        self.app = self.busy if full else self._app
        super().handle_events()

    def on_response_complete(self):
        cycle = self.cycle
        super().on_response_complete()
        if self.cycle is cycle and not self.transport.is_closing():  # no pipelined request began
            self._arm()
