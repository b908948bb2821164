"""Run as a script with 8 fake CPU devices: the loss trajectories of configs covering every
placement and position kind on several meshes, and a checkpoint saved on one mesh restored onto
another. Prints one JSON object."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import jax  # noqa: E402  (after XLA_FLAGS)
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from conftest import parameter_layout, tiny_config  # noqa: E402
from normstudy.core import placements  # noqa: E402
from normstudy.data import batches as batches_lib  # noqa: E402
from normstudy.data import sources as data  # noqa: E402
from normstudy.engine import execution  # noqa: E402
from normstudy.engine import sharding  # noqa: E402
import inprocess

# (runs, data, fsdp, tensor)
MESHES = {"single": (1, 1, 1, 1), "data8": (1, 8, 1, 1), "fsdp8": (1, 1, 8, 1),
          "tensor4": (1, 2, 1, 4), "d2f2t2": (1, 2, 2, 2)}
POSITIONS = ("sinusoidal", "learned", "conv")


def layout_placements():
  """Pre-LN and one placement per other parameter layout (Post-LN's is DeepNorm's, Mix-LN's is
  Pre-LN's): every parameter a placement adds is sharded on the meshes. Placements that share a
  layout differ only in where the same ops apply to activations sharded the same way; training
  each on one device is test_model.py's and test_techniques.py's."""
  chosen = {}
  for name in ["pre_ln", *placements.names()]:
    chosen.setdefault(parameter_layout(tiny_config(placement=name)), name)
  return sorted(chosen.values())


def configs(tmp, names):
  """One config per placement of `names`; together they use every position kind (conv:
  encoders). One layer (tiny_config's): a layer's parameters are sharded alike at any depth, and
  scanned ones keep their stacked layer axis (scan_layers on every other config)."""
  out = {}
  for i, name in enumerate(names):
    position = POSITIONS[i % len(POSITIONS)]
    config = tiny_config(placement=name, position_embedding=position, causal=position != "conv",
                         dtype="float32", use_bias=i % 2 == 0,
                         scan_layers=i % 2 == 0 or name == "pre_ln")  # Pre-LN's state moves
    config.data.update(data_dir=os.path.join(tmp, "tfds"), train_tokens=2**14,
                       validation_tokens=2**12, mask_prob=0.3, mask_length=2)
    config.train.batch_size = 8
    out[f"{name}/{position}"] = config
  return out


def meshes_for(name):
  """Every placement on one device and on the mesh that splits all three axes at once (every
  parameter's sharding is exercised there); Pre-LN on every mesh (its states also move between
  meshes). Each mesh compiles anew: 8 placements x 5 meshes took half of the test suite."""
  if name == "pre_ln":
    return list(MESHES)
  return ["single", "d2f2t2"]


def trajectory(config, shape, steps=4):
  config.mesh.update(dict(zip(sharding.AXES, shape)))
  mesh = sharding.make_mesh(config.mesh, jax.devices()[: int(np.prod(shape))])
  program = execution.ProgramSteps(config, mesh, num_runs=1)
  state, step = program.initial([config]), program.train
  batches = batches_lib.train_batches(config, _splits(config))
  losses = []
  for i in range(steps):
    batch = jax.tree.map(lambda x: x[None], batches[i])
    state, metrics = step(state, sharding.global_batch(mesh, batch))
    losses.append(float(metrics["loss"][0]))
  return losses, state


_SPLITS = {}


def _splits(config):
  """The dataset, read once per data config (every config here has the same vocabulary)."""
  key = json.dumps(config.data.to_dict(), sort_keys=True)
  if key not in _SPLITS:
    _SPLITS[key] = data.load_splits(config)
  return _SPLITS[key]


def sweep_trajectories(tmp, shape, steps=4):
  """[steps][8] losses of 8 runs (2 learning rates x 4 seeds) in one program on a mesh."""
  import copy
  base = tiny_config(causal=False, position_embedding="conv", dtype="float32", scan_layers=True)
  base.data.update(data_dir=os.path.join(tmp, "tfds"), train_tokens=2**14,
                   validation_tokens=2**12, mask_prob=0.3, mask_length=2)
  base.mesh.update(dict(zip(sharding.AXES, shape)))
  configs = []
  for lr in (1e-3, 3e-3):
    for seed in range(4):
      config = copy.deepcopy(base)
      config.optimizer.learning_rate, config.train.seed = lr, seed
      configs.append(config)
  mesh = sharding.make_mesh(base.mesh, jax.devices()[: int(np.prod(shape))])
  program = execution.ProgramSteps(base, mesh, num_runs=len(configs))
  state, step = program.initial(configs), program.train
  splits = _splits(base)
  datasets = [batches_lib.train_batches(c, splits) for c in configs]
  losses = []
  for i in range(steps):
    batch = {k: np.stack([d[i][k] for d in datasets]) for k in datasets[0][i]}
    state, metrics = step(state, sharding.global_batch(mesh, batch))
    losses.append(np.asarray(metrics["loss"]).tolist())
  state = program.stacked(state)
  return losses, str(state.params["layers"]["mlp"]["fc1"].sharding.spec)


def main(tmp):
  losses, states = {}, {}
  runs_one, _ = sweep_trajectories(tmp, (1, 1, 1, 1))
  runs_eight, runs_spec = sweep_trajectories(tmp, (8, 1, 1, 1))
  names = layout_placements()
  for name, config in configs(tmp, names).items():
    for mesh_name in meshes_for(name.split("/")[0]):
      losses[f"{name}@{mesh_name}"], state = trajectory(config, MESHES[mesh_name])
      if name.startswith("pre_ln/"):
        states[mesh_name] = state
  # Save on one mesh, restore onto another.
  saved, target = states["data8"], states["d2f2t2"]
  path = os.path.join(tmp, "ckpt")
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path, saved)
  with ocp.StandardCheckpointer() as ckpt:
    restored = ckpt.restore(path, inprocess.abstract(target))
  same = all(np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(restored)))
  kernel = restored.params["layers"]["mlp"]["fc1"]
  print(json.dumps({"losses": losses, "placements": names, "restored_equal": same,
                    "runs_one_device": runs_one, "runs_eight_devices": runs_eight,
                    "runs_sharding": runs_spec, "restored_sharding": str(kernel.sharding.spec),
                    "device_count": jax.device_count()}))


if __name__ == "__main__":
  main(sys.argv[1])
