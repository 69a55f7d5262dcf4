"""The HTTP front's rules for paths and request heads, on raw sockets against the endpoint alone.

Oracle: the status line each request gets, and that a request inside the bounds is still served.
An encoded '/' (``%2F``) was decoded before routing (``/v2/models/model%2Fready`` answered as the
ready route); a head of many lines (32 KiB) or one long line (60 KiB) arriving in one read passed
h11's 16 KiB limit, which holds only while a head is incomplete.
"""
import json
import socket
import time

import pytest

from inference.web.connections import HEAD_BYTES, HEAD_LINES
from inference.web.endpoint import EndpointOptions, HttpEndpoint
from inference.web.prometheus import ServingMetrics


@pytest.fixture(scope="module")
def endpoint():
    ep = HttpEndpoint(EndpointOptions(read_timeout=2.0), 4, 3, ServingMetrics(8))
    yield ep
    ep.close()
    ep.stop()


def _ask(ep, data, chunks=1):
    """Send ``data`` (in ``chunks`` writes) on a new connection; return the status line and the body."""
    with socket.create_connection((ep.host, ep.port), timeout=5) as s:
        step = -(-len(data) // chunks)
        for i in range(0, len(data), step):
            s.sendall(data[i:i + step])
        out = b""
        while b"\r\n\r\n" not in out or len(out.split(b"\r\n\r\n", 1)[1]) < _length(out):
            got = s.recv(65536)
            if not got:
                break
            out += got
    head, _, body = out.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


def _length(out):
    for line in out.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return int(value)
    return 0


@pytest.mark.parametrize("path", ["/v2/models/mo%2Fdel", "/v2/models/model%2Fready", "/v2/models/model%2fversions%2f1",
                                  "/v2/models/model/versions/1%2Fready"])
def test_an_encoded_slash_names_no_route(endpoint, path):
    status, body = _ask(endpoint, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status.startswith("HTTP/1.1 400") and "%2F" in json.loads(body)["error"], (status, body)


def test_the_plain_routes_still_answer(endpoint):
    assert _ask(endpoint, b"GET /v2/models/model/ready HTTP/1.1\r\nHost: x\r\n\r\n")[0].startswith("HTTP/1.1 200")
    assert _ask(endpoint, b"GET /v2/models/model HTTP/1.1\r\nHost: x\r\n\r\n")[0].startswith("HTTP/1.1 200")


def _head(lines, width=8):
    return (b"GET /v2/models/model HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-%d: %s\r\n" % (i, b"a" * width) for i in range(lines)) + b"\r\n")


@pytest.mark.parametrize("data, chunks", [
    (_head(HEAD_LINES), 1), (_head(3000), 1), (_head(3000), 7),
    (b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60000 + b"\r\n\r\n", 1),
    (b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (HEAD_BYTES + 1) + b"\r\n\r\n", 3)])
def test_a_head_over_its_bound_is_answered_431(endpoint, data, chunks):
    status, body = _ask(endpoint, data, chunks)
    assert status.startswith("HTTP/1.1 431") and b"head over" in body, status


def test_a_client_still_sending_its_head_after_the_431_reads_the_answer(endpoint):
    """The server answers 431 once the bound is passed; the client goes on sending 40 KiB more of its
    head. A close at once resets the connection (the client's send or read fails with ECONNRESET);
    the lingering close lets it read the answer."""
    big = _head(3000)
    with socket.create_connection((endpoint.host, endpoint.port), timeout=5) as s:
        s.sendall(big[:HEAD_BYTES + 1024])
        time.sleep(0.3)  # the server has read past the bound and answered
        for i in range(HEAD_BYTES + 1024, len(big), 4096):
            s.sendall(big[i:i + 4096])
            time.sleep(0.005)
        out = b""
        while got := s.recv(65536):
            out += got
    assert out.startswith(b"HTTP/1.1 431") and b"head over" in out, out[:200]


def test_a_head_inside_its_bounds_and_a_large_body_in_the_same_read_are_served(endpoint):
    assert _ask(endpoint, _head(HEAD_LINES - 3))[0].startswith("HTTP/1.1 200")
    body = b" " * 200000 + b"{}"  # a body far over the head's bound, sent with the head in one write
    status, _ = _ask(endpoint, b"POST /v2/models/model/infer HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n" % len(body) + body)
    assert status.startswith("HTTP/1.1 400"), status  # read whole, refused for what it says, not for its size
