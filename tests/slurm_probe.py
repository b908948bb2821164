"""Run as one SLURM task of a simulated job (tests/test_launch.py): joins the job through
normstudy's initialisation and prints, as one JSON object, what the task was told to use and the
devices and mesh it got."""

import json
import os

import jax

from normstudy.engine import sharding

joined = sharding.initialize_distributed()
mesh = jax.make_mesh((jax.device_count(),), ("data",))
print(json.dumps({
    "joined": joined, "local_device_ids": sharding.local_device_ids(),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "process_index": jax.process_index(), "process_count": jax.process_count(),
    "local_devices": jax.local_device_count(), "devices": jax.device_count(),
    "mesh": mesh.size, "compile_cache": jax.config.jax_compilation_cache_dir}))
jax.distributed.shutdown()
