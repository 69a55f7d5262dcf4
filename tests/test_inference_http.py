"""The Open Inference Protocol on a real server: tritonclient as the client, on 127.0.0.1, against a
serving job under mpiexec; malformed bodies, limits, a burst of connections, metrics, readiness,
SIGTERM drain; and a front that fails ends every rank. Answers are checked bitwise against the
single-process prediction of the same checkpoint (tests/test_inference.py's reference)."""
import asyncio
import http.client
import json
import re
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

from inference.web.endpoint import EndpointOptions, HttpEndpoint
from inference.web.prometheus import ServingMetrics
from inference.web.open_inference import ProtocolError, parse_infer
from tests.mpirun import job_failed, run_mpi
from tests.test_inference import _kill, _reference, _start, ckpt  # noqa: F401 -- the module's checkpoint fixture

tritonclient = pytest.importorskip("tritonclient.http")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

F = 64


def _body(data, shape=(1, F), datatype="FP64", **extra):
    return json.dumps({"inputs": [{"name": "features", "shape": list(shape), "datatype": datatype, "data": data}],
                      **extra}).encode()


def test_protocol_names_every_defect_of_a_body():
    row = [0.5] * 4
    ok = parse_infer(_body([row, row], shape=(2, 4)), 4)  # nested to the shape
    assert ok.rows.shape == (2, 4) and ok.id is None and ok.outputs == ("logits", "prediction")
    assert parse_infer(_body(row * 2, shape=(2, 4), id="x", outputs=[{"name": "logits"}]), 4).outputs == ("logits",)
    cases = [(b"{not json", "not valid JSON"), (b"\xff\xfe{}", "not UTF-8"), (b"[1]", "JSON object"),
             (b'{"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP64", "data": [NaN, 1, 2, 3]}]}', "NaN"),
             (b'{"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP64", "data": [1e400, 1, 2, 3]}]}',
              "overflows float64"),
             (b'{"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP64", "data": [' + b"9" * 400
              + b', 1, 2, 3]}]}', "overflows float64"),
             (_body([1, "a", 2, 3], shape=(1, 4)), "data[1] is not a number"),
             (_body([1, True, 2, 3], shape=(1, 4)), "not a number"),
             (_body([[1, 2], [3, 4]], shape=(1, 4)), "shape"), (_body(row[:3], shape=(1, 4)), "shape"),
             (_body(row, shape=(1, 3)), "shape must be [n >= 1, 4], got [1, 3]"),
             (_body(row, shape=(1.5, 4)), "got [1.5, 4]"),
             (_body(row, shape=(1, 4), datatype="BYTES"), "datatype"),
             (_body([1e39] * 4, shape=(1, 4), datatype="FP32"), "overflows FP32"),
             (b"[" * 30000 + b"]" * 30000, "nested too deeply"), (_body(row, shape=(1, 4), extra=1), "unknown field"),
             (json.dumps({"id": 5, "inputs": []}).encode(), "id must be a string"),
             (_body(row, shape=(1, 4), outputs=[{"name": "probs"}]), "outputs[0]"),
             (_body(row, shape=(1, 4), outputs=[{"name": "logits", "parameters": {"binary_data": True}}]), "binary")]
    for body, msg in cases:
        with pytest.raises(ProtocolError, match=re.escape(msg)) as e:
            parse_infer(body, 4)
        assert e.value.status == 400


def _raw(port, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.request("POST", "/v2/models/model/infer", body, {"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    code, text = r.status, r.read()
    c.close()
    return code, json.loads(text)


def _infer(client, x, rid=None):
    inp = tritonclient.InferInput("features", list(x.shape), "FP64")
    inp.set_data_from_numpy(x, binary_data=False)
    out = [tritonclient.InferRequestedOutput(n, binary_data=False) for n in ("logits", "prediction")]
    return client.infer("model", [inp], outputs=out, request_id=rid or "")


async def _burst(port, bodies, answers=False):
    """Open every connection first, then send every request: return the status codes (with ``answers``,
    (status, parsed JSON body) pairs)."""
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in bodies]
    for (_, w), b in zip(conns, bodies):
        w.write(b"POST /v2/models/model/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(b) + b)

    async def status(r, w):
        line = await asyncio.wait_for(r.readline(), 60)
        rest = await r.read()
        w.close()
        code = int(line.split()[1]) if line else 0
        return (code, json.loads(rest.partition(b"\r\n\r\n")[2] or b"null")) if answers else code

    return await asyncio.gather(*(status(r, w) for r, w in conns))


def _metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return {s.name + json.dumps(s.labels, sort_keys=True): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_open_inference_protocol_answers_refuses_bad_bodies_survives_a_burst_and_drains(ckpt, tmp_path):  # noqa: F811
    out = str(tmp_path / "v2")
    # batches of exactly 8: a partial batch waits (20 s) until SIGTERM makes the drain send it
    proc, port = _start(ckpt, out, "--replicas", 2, "--max-batch", 8, "--max-wait-ms", 20000, "--service-ms", 20,
                        "--read-timeout", 3, "--max-body-bytes", 65536)
    try:
        data, ref, _ = _reference(ckpt, 8)
        client = tritonclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("model")
        meta = client.get_model_metadata("model")
        assert meta["inputs"][0]["shape"] == [-1, F] and meta["outputs"][0]["shape"] == [-1, 10]
        with pytest.raises(tritonclient.InferenceServerException, match="unknown model"):
            client.get_model_metadata("other")
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("POST", "/v2/health/live")
        r = c.getresponse()
        assert r.status == 405 and "no route POST /v2/health/live" in json.loads(r.read())["error"]
        c.close()
        x = data.x_test[:8].astype(np.float64)
        res = _infer(client, x, rid="req-7")
        assert res.get_response()["id"] == "req-7"
        assert np.array_equal(res.as_numpy("logits"), np.stack([ref(v) for v in x]))  # bitwise
        assert res.as_numpy("prediction").tolist() == [int(ref(v).argmax()) for v in x]
        row = x[0].tolist()
        bad = [(b"{not json", 400, "not valid JSON"), (b"\xc3\x28", 400, "not UTF-8"),
               (_body(row[:-1] + [float("nan")]), 400, "NaN"),
               (_body(row[:-1]).replace(b"]}", b", 1e999]}", 1), 400, "overflows"),
               (_body(row[:-1] + ["x"]), 400, "not a number"), (_body([[row]]), 400, "shape"),
               (_body(row[:-1]), 400, "shape"), (b"[" * 20000, 400, "nested too deeply"),
               (b" " * 70000, 413, "over the limit"),
               (_body(x.tolist()[:3] + [[1e308] * F] + x.tolist()[4:], shape=(8, F)), 400, "row 3: the model's logits"),
               (_body(row), 400, "binary-data", {"Inference-Header-Content-Length": "10"})]
        for body, code, msg, *headers in bad:
            got, ans = _raw(port, body, *headers)
            assert got == code and msg in ans["error"], (body[:40], got, ans)
        # a body that never completes gets 408 after --read-timeout; a client that leaves is nobody's problem
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v2/models/model/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"in")
        t0 = time.time()
        reply = s.recv(4096)
        while b"\r\n\r\n" in reply and b"read-timeout" not in reply and time.time() - t0 < 10:
            more = s.recv(4096)  # the body may come in a segment of its own after the headers
            if not more:
                break
            reply += more
        assert reply.startswith(b"HTTP/1.1 408") and b"read-timeout" in reply and 2.8 < time.time() - t0 < 10
        s.close()
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v2/models/model/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        s.close()
        # several hundred simultaneous connections: every one answered, every answer bitwise right (each
        # connection's request head is due within --read-timeout of its opening, 3 s for all 296 to open)
        n = 296  # 37 full batches
        bodies = [_body([data.x_test[i % len(data.x_test)].tolist()]) for i in range(n)]
        assert asyncio.run(_burst(port, bodies)) == [200] * n
        m = _metrics(port)
        ok = 8 + 7 + n  # the overflowing request's 7 other rows were answered too, then the request refused
        assert m['commlab_serving_requests_total{"outcome": "ok"}'] == ok
        assert m['commlab_serving_requests_total{"outcome": "rejected"}'] == len(bad) + 1  # and the 408
        assert m['commlab_serving_replicas_alive{}'] == 2 and m['commlab_serving_queue_depth{}'] == 0
        assert m['commlab_serving_batch_size_sum{}'] == ok + 1 and m['commlab_serving_batch_size_count{}'] == 39
        assert m['commlab_serving_request_latency_seconds_count{}'] == ok
        # SIGTERM drains: requests in flight are answered, then every rank exits 0
        results = {}

        def one(i):
            results[i] = _infer(tritonclient.InferenceServerClient(f"127.0.0.1:{port}"), data.x_test[i:i + 1])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(7)]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while _metrics(port)['commlab_serving_queue_depth{}'] < 7:  # 7 wait for an eighth
            assert time.time() < deadline
            time.sleep(0.01)
        os.kill(proc.front_pid, signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert sorted(results) == list(range(7))
        assert all(np.array_equal(r.as_numpy("logits")[0], ref(data.x_test[i])) for i, r in results.items())
        text = proc.communicate(timeout=30)[0]
        assert proc.returncode == 0, text
        assert "None ms" not in text and "latency per request not kept over HTTP (GET /metrics" in text, text
    finally:
        _kill(proc)
    s = json.load(open(os.path.join(out, "summary.json")))
    assert (s["answered"], s["pending"], s["duplicate_answers"]) == (ok + 7, 0, 0)


def test_readiness_follows_the_replicas_and_a_failed_front_ends_every_rank(ckpt, tmp_path):  # noqa: F811
    proc, port = _start(ckpt, str(tmp_path / "one"), "--replicas", 1, "--fail-replica", "0:1", "--replica-timeout",
                        0.5, n=2)
    try:
        data, ref, _ = _reference(ckpt, 8)
        client = tritonclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_ready()
        assert np.array_equal(_infer(client, data.x_test[:1]).as_numpy("logits")[0], ref(data.x_test[0]))
        with pytest.raises(tritonclient.InferenceServerException, match="no replica left|failed to answer"):
            _infer(client, data.x_test[1:2])  # the replica is silent: removed, the request fails (503)
        assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("model")
        os.kill(proc.front_pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        _kill(proc)
    t0 = time.time()
    r = run_mpi(3, "inference.serve", "--checkpoint", ckpt, "--replicas", 2, "--requests", 400, "--rate", 2000,
                "--fail-front", 3, "--run-dir", str(tmp_path / "ff"), check=False, timeout=60)
    assert r.returncode != 0 and time.time() - t0 < 30
    assert "error: rank 0: front: RuntimeError: front fault injected after 3 batches" in r.stdout, r.stdout


OK, REFUSED = 'commlab_serving_requests_total{"outcome": "ok"}', 'commlab_serving_requests_total{"outcome": "refused"}'


def test_an_objective_answers_429_over_http_and_connections_are_bounded(ckpt, tmp_path):  # noqa: F811
    """One replica, 20 ms per batch of up to 8, ``--slo-ms 60``: four simultaneous requests of 32 rows
    each (128 rows at once) are each answered 429 naming the objective; every row is counted, ok or
    refused. ``--max-connections 4``: while four connections that never complete a request head are
    open, a fifth connection's request is answered 503 (JSON) and counted refused; the four are
    closed by the server after ``--read-timeout``, and then a request is answered."""
    proc, port = _start(ckpt, str(tmp_path / "slo"), "--replicas", 1, "--service-ms", 20, "--max-batch", 8,
                        "--slo-ms", 60, "--max-connections", 4, "--read-timeout", 2, n=2)
    try:
        data, ref, _ = _reference(ckpt, 8)
        got = asyncio.run(_burst(port, [_body(data.x_test[:32].tolist(), shape=(32, F))] * 4, answers=True))
        assert [code for code, _ in got] == [429] * 4, got  # at most 3 batches of 8 fit in 60 ms: rows refused
        assert all("latency objective of 60 ms" in ans["error"] for _, ans in got), got
        m = _metrics(port)
        assert m[REFUSED] > 0 and m[OK] + m[REFUSED] == 4 * 32, m
        t_open = time.time()
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        idle[2].sendall(b"POST /v2/models/model/infer HTTP/1.1\r\nHo")  # heads that never complete
        idle[3].sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        time.sleep(0.3)  # let the server accept them (order, not a timed check)
        code, ans = _raw(port, _body([data.x_test[0].tolist()]))
        assert code == 503 and "more than 4 connections open (--max-connections)" in ans["error"], ans
        for s in idle:
            s.settimeout(30)
            assert s.recv(100) == b"", "the server closes a connection without a request head, answering nothing"
            s.close()
        assert time.time() - t_open > 1.9  # not before --read-timeout (a lower bound only)
        client = tritonclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert np.array_equal(_infer(client, data.x_test[:1]).as_numpy("logits")[0], ref(data.x_test[0]))
        m2 = _metrics(port)
        assert (m2[OK], m2[REFUSED]) == (m[OK] + 1, m[REFUSED] + 1), (m, m2)
        os.kill(proc.front_pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        _kill(proc)


def test_a_port_in_use_ends_the_job_with_one_line(ckpt, tmp_path):  # noqa: F811
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        r = run_mpi(2, "inference.serve", "--checkpoint", ckpt, "--replicas", 1, "--http", port, "--run-dir",
                    str(tmp_path / "busy"), check=False, timeout=30)
    finally:
        holder.close()
    assert job_failed(r), r.stdout
    errors = [line for line in r.stdout.splitlines() if line.startswith("error:")]
    assert errors == [f"error: rank 0: front: OSError: cannot listen on 127.0.0.1 port {port} (--host, --http): "
                      "Address already in use"], r.stdout


def test_the_front_notices_a_dead_server_thread():
    ep = HttpEndpoint(EndpointOptions(port=0), 4, 3, ServingMetrics(8))
    try:
        ep.check()  # serving
        ep._server.should_exit = True  # the server's thread ends on its own, as if uvicorn had died
        ep._thread.join(10)
        with pytest.raises(RuntimeError, match="the HTTP server's thread ended"):
            ep.check()  # the front loop calls this every turn: the job ends (MPI_Abort) with the reason
    finally:
        ep.stop()
