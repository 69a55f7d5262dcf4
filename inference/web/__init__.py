"""The front's HTTP server: the Open Inference Protocol (KServe V2) on Starlette, served by uvicorn.

- :mod:`inference.web.open_inference`: request parsing and response bodies of the protocol (every
  byte a client sends is checked here before any of it is kept);
- :mod:`inference.web.connections`: uvicorn's h11 protocol with a deadline for the request head and a
  limit on connections;
- :mod:`inference.web.prometheus`: the front's metrics in Prometheus text format (``GET /metrics``);
- :mod:`inference.web.endpoint`: the routes and the server thread that hands requests to the front.

May import :mod:`inference.request` and the packages below ``inference``; never the front's loop,
the replicas or the command.
"""
