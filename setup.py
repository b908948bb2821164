"""normstudy: transformer training-stability studies in JAX/Flax."""

import setuptools

# Ranges resolve on Python 3.11 (jax 0.10.x, flax 0.12.8) and 3.12 (jax 0.12.x, flax 0.12.x).
INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.13",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "tensorflow-datasets>=4.9.10,<5",
    # tfds 4.9.10 registers builders through etils.epath, which needs these but does not pull them in.
    "etils[epath,epy]>=1.7",
    "importlib_resources>=6",
    "tensorflow-cpu>=2.21,<2.22",
    "tensorboard>=2.21,<2.22",
    "ml-collections>=1.1,<2",
    "absl-py>=2.1,<3",
    "clu>=0.0.12,<0.1",
    "grain>=0.2.18,<0.3",
    "array-record>=0.8,<0.9",
    "sentencepiece>=0.2,<0.3",
    "matplotlib>=3.9,<4",
    "pandas>=2.2,<4",
    # gs:// workdirs (normstudy.records.storage): etils.epath's fsspec backend; orbax's arrays go
    # through tensorstore, which brings its own GCS driver.
    "gcsfs>=2025.1",
    # jax's on-disk compilation cache locks its directory with it when given a size limit
    # (normstudy.cli.use_compile_cache), so processes that share the cache never read a
    # half-written program.
    "filelock>=3.12",
]

EXTRAS_REQUIRE = {
    "test": ["pytest>=8", "pytest-xdist>=3.5", "nbclient>=0.10", "nbformat>=5.10",
             "ipykernel>=6.29",
             # A GCS JSON API server on 127.0.0.1 for the gs:// tests (tests/gcs_server.py).
             "gcp-storage-emulator>=2024.8,<2027",
             # The Weights & Biases writer, tested in its offline mode (tests/test_tracking.py).
             "wandb>=0.19,<1"],
    "wandb": ["wandb>=0.19,<1"],
    "gpu": ["jax[cuda12]>=0.10.2,<0.13"],
    "tpu": ["jax[tpu]>=0.10.2,<0.13"],
}

setuptools.setup(
    name="normstudy",
    version="0.1.0",
    description="Compare transformer block designs and gradient clipping for training stability.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # configs/ too: its files build on one another (`from configs import seed_figure`).
    packages=setuptools.find_packages(include=["normstudy", "normstudy.*", "configs"]),
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
