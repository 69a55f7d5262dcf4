"""The floor every layer shares (commlab/): it imports and works with mpi4py and every other project
package out of reach, so that any layer can stand on it.

Oracle: an import hook that refuses mpi4py and the project's other packages (any import of them fails
the run), and NumPy's own comparison of what a written file reads back.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_ALONE = r"""
import importlib
import os
import pkgutil
import sys
import tempfile

OUT_OF_REACH = ("mpi4py", "collectives", "ps", "training", "inference", "plots", "experiments")


class Block:  # neither mpi4py nor another layer of the project is importable, as far as this process can tell
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in OUT_OF_REACH:
            raise ImportError(f"No module named {name!r} (blocked by the test)")


sys.meta_path.insert(0, Block())
import numpy as np
import commlab

names = [m.name for m in pkgutil.iter_modules(commlab.__path__, "commlab.")]
for name in names:
    importlib.import_module(name)
assert len(names) >= 9, names
from commlab import byte_sizes, file_formats, run_files, tracing

d = tempfile.mkdtemp()
arrays = {"params": np.arange(5, dtype=np.float32), "steps": np.array([3], np.int64)}
file_formats.write_npz(os.path.join(d, "a.npz"), arrays)
back = file_formats.read_npz(os.path.join(d, "a.npz"))
assert sorted(back) == sorted(arrays) and all(np.array_equal(back[k], arrays[k]) for k in arrays)
file_formats.write_json(os.path.join(d, "config.json"), {"config": {}, "run": {"run_id": "5f2a"}})
assert run_files.run_id_of(d) == "5f2a"
assert byte_sizes.parse_bytes("64M") == 64 << 20 and byte_sizes.format_bytes(64 << 20) == "64 MiB"
tracing.start()
with tracing.span("forward", "compute"):
    pass
tracing.stop()
assert [e[:2] for e in tracing.events()] == [("forward", "compute")]
assert not any(m.split(".")[0] in OUT_OF_REACH for m in sys.modules), sorted(sys.modules)
print("commlab stands alone:", len(names), "modules")
"""


def test_commlab_imports_and_works_without_mpi4py_or_any_other_layer():
    proc = subprocess.run([sys.executable, "-c", _ALONE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "commlab stands alone" in proc.stdout
