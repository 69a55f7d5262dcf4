"""The Open Inference Protocol (KServe V2, as Triton serves it): request parsing and response bodies.

The JSON tensor format of the protocol's ``POST /v2/models/{name}/infer``: a request is an object
``{"id"?: str, "parameters"?: {...}, "inputs": [{"name", "shape", "datatype", "data"}], "outputs"?:
[{"name", "parameters"?}]}``; ``data`` holds the tensor's elements in row-major order, flat or nested
to the tensor's shape. The model here has one input, ``features`` of shape ``[n, F]`` (``FP64`` or
``FP32``), and two outputs, ``logits`` ``[n, C]`` ``FP64`` and ``prediction`` ``[n]`` ``INT64``. A
response is ``{"model_name", "model_version", "id"?, "outputs": [{"name", "shape", "datatype",
"data"}]}``, the request's ``id`` echoed; an error is ``{"error": "..."}`` with a 4xx status.

Everything a client can send is checked here before any of it is kept: the bytes are UTF-8 and JSON
(RFC 8259: no ``NaN`` or ``Infinity`` tokens, no number that overflows float64, nesting no deeper
than the tensor), the shapes and datatypes are the model's, every element is a real number.
Response bodies are written with ``allow_nan=False``, so they are valid JSON or not written at all.
The binary-data extension is not offered: a request that uses it is refused with a 400 naming it.
"""
import json
import math

import numpy

from commlab.error_root import CommlabError

__all__ = ["ProtocolError", "InferCall", "parse_infer", "infer_response", "model_metadata", "server_metadata",
           "error_body", "dumps"]

_INPUT_TYPES = {"FP64": numpy.float64, "FP32": numpy.float32}
OUTPUTS = ("logits", "prediction")


class ProtocolError(CommlabError, ValueError):
    """A request the protocol refuses: ``status`` is the HTTP status to answer with (4xx)."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = int(status)


class InferCall:
    """One parsed inference request.

    Attributes
    ----------
    id : str or None
        The request's ``id``, echoed in the response.
    rows : ndarray, shape (n, n_features), float64
    outputs : tuple of str
        Output names to return, in order.
    """

    __slots__ = ("id", "rows", "outputs")

    def __init__(self, rid, rows, outputs):
        self.id, self.rows, self.outputs = rid, rows, tuple(outputs)


def _constant(name):
    raise ValueError(f"{name} is not a JSON number (RFC 8259)")


def _finite(text):
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:32]}{'...' if len(text) > 32 else ''} overflows float64")
    return v


def _loads(body):
    """Decode ``body`` (bytes) as strict JSON; raise :class:`ProtocolError` saying what is wrong."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"body is not UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_finite, parse_int=_finite)
    except RecursionError:
        raise ProtocolError("body is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and the hooks' errors
        raise ProtocolError(f"body is not valid JSON: {e}") from None


def _echo(value, limit=40):
    """Return ``value`` as the client wrote it, for an error message, cut to ``limit`` characters.

    JSON numbers are read as floats here (:func:`_loads`), so integral ones are shown without ``.0``.

    Examples
    --------
    >>> _echo([1.0, 3.0]), _echo([1.5, 4.0]), _echo("a")
    ('[1, 3]', '[1.5, 4]', 'a')
    """
    if isinstance(value, list):
        text = "[" + ", ".join(_echo(v, limit) for v in value[:limit // 2]) + "]"
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    else:
        text = str(value)
    return text[:limit]


def _flatten(data, shape):
    """Return the elements of ``data`` (flat, or nested to ``shape``) as a list; raise ProtocolError."""
    size = math.prod(shape)
    if isinstance(data, list) and len(data) == size and not any(isinstance(v, list) for v in data):
        flat = data
    else:
        level = [data]
        for depth, n in enumerate(shape):
            nxt = []
            for item in level:
                if not isinstance(item, list) or len(item) != n:
                    raise ProtocolError(f"inputs[0].data does not have shape {list(shape)} "
                                        f"(at depth {depth}: expected a list of {n})")
                nxt.extend(item)
            level = nxt
        flat = level
    for i, v in enumerate(flat):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProtocolError(f"inputs[0].data[{i}] is not a number: {str(v)[:40]!r}")
    return flat


def parse_infer(body, n_features):
    """Parse an infer request body into an :class:`InferCall`, or raise :class:`ProtocolError`.

    Parameters
    ----------
    body : bytes
        The request body as received.
    n_features : int
        F, the model's input width.

    Returns
    -------
    InferCall
        ``rows`` is (n, F) float64 (an FP32 input is rounded to float32 first, as the client sent it).

    Raises
    ------
    ProtocolError
        Status 400, naming the defect: not UTF-8, not JSON, NaN/Infinity or an overflowing number,
        a missing or extra field, another input name, shape or datatype, a non-number element, the
        binary-data extension.

    Examples
    --------
    >>> call = parse_infer(b'{"id": "a", "inputs": [{"name": "features", "shape": [1, 2], '
    ...                    b'"datatype": "FP64", "data": [0.5, 2]}]}', 2)
    >>> call.id, call.rows.tolist(), call.outputs
    ('a', [[0.5, 2.0]], ('logits', 'prediction'))
    >>> parse_infer(b'{"inputs": [{"name": "features", "shape": [1, 2], "datatype": "FP64", '
    ...             b'"data": [NaN, 1]}]}', 2)
    Traceback (most recent call last):
    ...
    inference.web.open_inference.ProtocolError: body is not valid JSON: NaN is not a JSON number (RFC 8259)
    """
    doc = _loads(body)
    if not isinstance(doc, dict):
        raise ProtocolError(f"body must be a JSON object, got {type(doc).__name__}")
    extra = set(doc) - {"id", "parameters", "inputs", "outputs"}
    if extra:
        raise ProtocolError(f"unknown field(s) {', '.join(sorted(map(str, extra)))[:80]}")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError("id must be a string")
    if doc.get("parameters", {}).get("binary_data_output") if isinstance(doc.get("parameters"), dict) else False:
        raise ProtocolError("the binary-data extension is not supported (binary_data_output)")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError("inputs must be a list of one tensor, features")
    t = inputs[0]
    if t.get("name") != "features":
        raise ProtocolError(f"unknown input {str(t.get('name'))[:40]!r}: the model's input is features")
    if isinstance(t.get("parameters"), dict) and "binary_data_size" in t["parameters"]:
        raise ProtocolError("the binary-data extension is not supported: send inputs with binary_data=False")
    if t.get("datatype") not in _INPUT_TYPES:
        raise ProtocolError(f"inputs[0].datatype must be one of {', '.join(_INPUT_TYPES)}, got "
                            f"{str(t.get('datatype'))[:20]!r}")
    shape = t.get("shape")
    if (not isinstance(shape, list) or len(shape) != 2 or not all(type(s) is float and s.is_integer() for s in shape)
            or shape[0] < 1 or shape[1] != n_features):
        raise ProtocolError(f"inputs[0].shape must be [n >= 1, {n_features}], got {_echo(shape)}")
    shape = (int(shape[0]), int(shape[1]))
    if "data" not in t:
        raise ProtocolError("inputs[0].data is missing")
    flat = _flatten(t["data"], shape)
    with numpy.errstate(over="ignore"):  # an FP32 overflow becomes inf, refused just below
        rows = numpy.array(flat, dtype=_INPUT_TYPES[t["datatype"]]).astype(numpy.float64).reshape(shape)  # (n, F)
    if not numpy.isfinite(rows).all():
        raise ProtocolError(f"inputs[0].data[{int(numpy.flatnonzero(~numpy.isfinite(rows))[0])}] overflows "
                            f"{t['datatype']}")
    return InferCall(rid, rows, _outputs(doc.get("outputs")))


def _outputs(spec):
    if spec is None:
        return OUTPUTS
    if not isinstance(spec, list) or not spec:
        raise ProtocolError("outputs must be a non-empty list of {\"name\": ...}")
    names = []
    for i, o in enumerate(spec):
        if not isinstance(o, dict) or o.get("name") not in OUTPUTS:
            raise ProtocolError(f"outputs[{i}] must name one of {', '.join(OUTPUTS)}")
        if isinstance(o.get("parameters"), dict) and o["parameters"].get("binary_data"):
            raise ProtocolError("the binary-data extension is not supported: request outputs with binary_data=False")
        names.append(o["name"])
    return names


def dumps(obj):
    """Return ``obj`` as JSON bytes; ``ValueError`` rather than a NaN or Infinity token (RFC 8259).

    Examples
    --------
    >>> dumps({"a": [1.5]})
    b'{"a":[1.5]}'
    >>> dumps({"a": float("nan")})
    Traceback (most recent call last):
    ...
    ValueError: Out of range float values are not JSON compliant
    """
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()


def error_body(message):
    """Return the protocol's error body ``{"error": message}`` as bytes.

    Examples
    --------
    >>> error_body("bad shape")
    b'{"error":"bad shape"}'
    """
    return dumps({"error": str(message)})


def infer_response(model, rid, logits, outputs=OUTPUTS):
    """Return the infer response body (bytes) for ``logits``.

    Parameters
    ----------
    model : str
        Model name.
    rid : str or None
        The request's id (left out when None).
    logits : ndarray, shape (n, n_classes), float64
    outputs : sequence of str
        Names of :data:`OUTPUTS` to include.

    Raises
    ------
    ValueError
        When a logit is not finite (the body would not be JSON).

    Examples
    --------
    >>> infer_response("m", "7", numpy.array([[0.5, -1.0]]), ["logits"])
    b'{"model_name":"m","model_version":"1","id":"7","outputs":[{"name":"logits","shape":[1,2],"datatype":"FP64","data":[0.5,-1.0]}]}'
    """
    n, c = logits.shape
    tensors = {"logits": {"name": "logits", "shape": [n, c], "datatype": "FP64", "data": logits.ravel().tolist()},
               "prediction": {"name": "prediction", "shape": [n], "datatype": "INT64",
                              "data": logits.argmax(axis=1).tolist()}}
    doc = {"model_name": model, "model_version": "1"}
    if rid is not None:
        doc["id"] = rid
    doc["outputs"] = [tensors[o] for o in outputs]
    return dumps(doc)


def model_metadata(model, n_features, n_classes):
    """Return ``GET /v2/models/{name}``'s body as a dict (name, versions, platform, inputs, outputs).

    Examples
    --------
    >>> model_metadata("m", 64, 10)["inputs"]
    [{'name': 'features', 'datatype': 'FP64', 'shape': [-1, 64]}]
    """
    return {"name": model, "versions": ["1"], "platform": "commlab_mlp",
            "inputs": [{"name": "features", "datatype": "FP64", "shape": [-1, int(n_features)]}],
            "outputs": [{"name": "logits", "datatype": "FP64", "shape": [-1, int(n_classes)]},
                        {"name": "prediction", "datatype": "INT64", "shape": [-1]}]}


def server_metadata(version):
    """Return ``GET /v2``'s body as a dict (name, version, extensions).

    Examples
    --------
    >>> server_metadata("0.1.0")
    {'name': 'commlab', 'version': '0.1.0', 'extensions': []}
    """
    return {"name": "commlab", "version": str(version), "extensions": []}
