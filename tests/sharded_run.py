"""Run as a script with 8 fake CPU devices: the loss trajectory of one config on several meshes,
and a checkpoint saved on one mesh restored onto another. Prints one JSON object."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import jax  # noqa: E402  (after XLA_FLAGS)
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from conftest import tiny_config  # noqa: E402
from normstudy import checkpoints, data, sharding  # noqa: E402

# (runs, data, fsdp, tensor)
MESHES = {"single": (1, 1, 1, 1), "8x1x1": (1, 8, 1, 1), "2x2x2": (1, 2, 2, 2),
          "2x1x4": (1, 2, 1, 4), "1x8x1": (1, 1, 8, 1)}


def main(tmp):
  config = tiny_config(causal=False, dtype="float32", d_ff=64)
  config.data.update(data_dir=os.path.join(tmp, "tfds"), train_tokens=2**14,
                     validation_tokens=2**12, mask_prob=0.3, mask_length=2)
  config.train.batch_size = 8
  splits = data.load_splits(config)
  batches = data.train_batches(config, splits)
  losses, states = {}, {}
  for name, shape in MESHES.items():
    config.mesh.update(dict(zip(sharding.AXES, shape)))
    devices = jax.devices()[: int(np.prod(shape))]
    mesh = sharding.make_mesh(config.mesh, devices)
    state, shardings = sharding.create_states([config], mesh)
    step = sharding.jit_train_step(config, mesh, shardings)
    losses[name] = []
    for i in range(6):
      batch = jax.tree.map(lambda x: x[None], batches[i])
      state, metrics = step(state, sharding.global_batch(mesh, batch))
      losses[name].append(float(metrics["loss"][0]))
    states[name] = (state, shardings, mesh)
  # Save on one mesh, restore onto another.
  saved, _, _ = states["8x1x1"]
  target_state, target_shardings, _ = states["2x2x2"]
  path = os.path.join(tmp, "ckpt")
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path, saved)
  with ocp.StandardCheckpointer() as ckpt:
    restored = ckpt.restore(path, checkpoints.abstract(target_state))
  same = all(np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(restored)))
  kernel = restored.params["layers"]["mlp"]["fc1"]
  print(json.dumps({"losses": losses, "restored_equal": same,
                    "restored_sharding": str(kernel.sharding.spec),
                    "device_count": jax.device_count()}))


if __name__ == "__main__":
  main(sys.argv[1])
