"""Data-parallel JAX on the CPU with commlab's all-reduce: ``mpiexec -n P python -m experiments.jax_example``.

Each rank takes its shard of the digits' training split, computes the gradient of a softmax
regression with ``jax.grad``, and averages every leaf of the gradient pytree over the ranks with
``collectives.allreduce(leaf, op="avg", algorithm=...)``: a JAX array goes in through DLPack and a JAX
array comes back. Every rank then takes the same SGD step. At the first step the averaged gradient is
compared with ``jax.grad`` of the loss over all ranks' samples together (a single-process oracle;
equal shards, so the mean of the shard means is the full mean), and the last line reports the test
accuracy. Needs JAX (``pip install jax``), which commlab itself does not require.
"""
import sys

import numpy as np
from mpi4py import MPI

import collectives
from training.settings.options import INT32_MAX, Parser, integer, real


def parse_args(argv=None):
    """Return the command-line options (``--steps``, ``--lr``, ``--algorithm``)."""
    p = Parser(prog="python -m experiments.jax_example", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=integer(1, INT32_MAX), default=200, help="SGD steps (default 200)")
    p.add_argument("--lr", type=real(0, 1e15, low_open=True), default=0.5, help="learning rate (default 0.5)")
    p.add_argument("--algorithm", default="ring", choices=sorted(collectives.ALGORITHMS),
                   help="commlab all-reduce algorithm (default ring)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def main(argv=None):
    """Train and report; return the exit status (0 when the gradient check passes)."""
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        import jax
        import jax.numpy as jnp
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        from sklearn.preprocessing import StandardScaler
    except ImportError as exc:  # one line from rank 0, no traceback from every rank
        if comm.Get_rank() == 0:
            what = "pip install jax" if (exc.name or "").startswith("jax") else "pip install -e '.[data]'"
            print(f"error: the JAX example needs {exc.name or exc}: {what}", file=sys.stderr, flush=True)
        return 2
    rank, size = comm.Get_rank(), comm.Get_size()
    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(xtr)
    xtr, xte = scaler.transform(xtr).astype(np.float32), scaler.transform(xte).astype(np.float32)
    n = xtr.shape[0] // size  # equal shards: the mean of shard means is the full-batch mean
    mine = slice(rank * n, (rank + 1) * n)
    xs, ys = jnp.asarray(xtr[mine]), jnp.asarray(ytr[mine])  # (n, 64), (n,)

    def loss(params, x, y):
        logits = x @ params["w"] + params["b"]  # (B, 10)
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])

    grad = jax.jit(jax.grad(loss))
    params = {"w": jnp.zeros((64, 10), jnp.float32), "b": jnp.zeros(10, jnp.float32)}
    ok = True
    for step in range(args.steps):
        g = grad(params, xs, ys)
        g = jax.tree_util.tree_map(lambda t: collectives.allreduce(t, op="avg", algorithm=args.algorithm), g)
        if step == 0:
            full = grad(params, jnp.asarray(xtr[:n * size]), jnp.asarray(ytr[:n * size]))
            err = max(float(jnp.max(jnp.abs(g[k] - full[k]))) for k in g)
            ok = err <= 1e-5 and all(type(g[k]) is type(full[k]) for k in g)
            if rank == 0:
                print(f"step 0: the averaged gradient {'matches' if ok else 'DIFFERS FROM'} the full-batch "
                      f"gradient (max |diff| {err:.2g}, {type(g['w']).__name__} in and out)")
        params = jax.tree_util.tree_map(lambda p, d: p - args.lr * d, params, g)
    acc = float(jnp.mean(jnp.argmax(jnp.asarray(xte) @ params["w"] + params["b"], axis=1) == jnp.asarray(yte)))
    if rank == 0:
        print(f"P = {size}, {args.steps} steps, {args.algorithm}: test accuracy {100 * acc:.2f}%")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
