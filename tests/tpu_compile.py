"""Run as a subprocess by tests/test_compile.py: a small config compiled for v5e:2x2 (libtpu
from make tpu-aot, loaded only in this process), its figures printed as one JSON line."""

import json
import sys

from normstudy.engine import aot

aot.prepare_tpu_compiler("v5e:2x2")

import jax  # noqa: E402  (after the TPU compiler is named)
import numpy as np  # noqa: E402

from normstudy.core import config as config_lib  # noqa: E402
from normstudy.engine import execution  # noqa: E402
from normstudy.engine import sharding  # noqa: E402


DTYPE = "bfloat16"


def config(fsdp, remat):
  c = config_lib.default_config()
  c.model.update(num_layers=4, d_model=256, num_heads=4, d_ff=1024, max_len=512, vocab_size=256,
                 scan_layers=True, remat=remat, dtype=DTYPE)
  c.train.batch_size = 8
  c.mesh.update(data=4 // fsdp, fsdp=fsdp)
  return c


def main():
  devices = aot.topology_devices("v5e:2x2")
  out = {}
  for name, (fsdp, remat) in {"fsdp4": (4, "none"), "data4": (1, "none"),
                              "fsdp4_block": (4, "block")}.items():
    c = config(fsdp, remat)
    out[name] = aot.compile_for(c, devices, "v5e:2x2").as_json()
  # The state each chip holds, from the shardings (parameters and optimizer moments).
  c = config(4, "none")
  mesh = sharding.make_mesh(c.mesh, devices)
  steps = execution.ProgramSteps(c, mesh, num_runs=1)
  state = steps.abstract([c])
  full = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(state))
  per_chip = sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
                 for x in jax.tree.leaves(state))
  out["state_bytes"] = {"full": full, "per_chip": per_chip}
  # What the program carries of XLA:CPU's choices: none.
  out["choices"] = {"fusion_boundaries": steps.choices.fusion_boundaries,
                    "compiler_options": steps.choices.compiler_options,
                    "one_at_a_time": execution.ProgramSteps(c, mesh, 4).one_at_a_time}
  shape = (1, c.train.batch_size, c.model.max_len)
  batch = {"tokens": jax.ShapeDtypeStruct(shape, np.int32, sharding=sharding.batch_sharding(mesh))}
  with jax.set_mesh(mesh):
    text = steps.train.lower(state, batch).compile().as_text()
  out["barriers"] = text.count("opt-barrier")
  print(json.dumps(out))


if __name__ == "__main__":
  sys.exit(main())
