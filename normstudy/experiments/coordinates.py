"""The coordinate check (Yang et al. 2022, "Tensor Programs V", section 4 and the `mup` package's
`get_coord_data`): a model of each width trained a few steps on one fixed batch, the RMS of each
layer's output and of its change since initialisation recorded after every step. Under a
parametrization whose rates transfer, the curves are flat in width; under sp they grow (or
shrink) with it.

`measure(config, parametrization, widths, steps, lr)` -> rows (COLUMNS); nothing is written here
(normstudy.coordcheck writes coordcheck.csv and its figure).
"""

import copy

import jax
import jax.numpy as jnp
import numpy as np

from normstudy.core import config as config_lib
from normstudy.core import model as model_lib
from normstudy.core import parametrizations
from normstudy.core import per_run
from normstudy.core import steps as steps_lib

COLUMNS = ["parametrization", "width", "step", "layer", "quantity", "rms"]
QUANTITIES = ("output", "update")  # a layer's output; its change since step 0


def width_config(config, parametrization: str, width: int, head_dim: int, lr: float):
  """`config` at `width` (d_ff 4x, heads head_dim wide) under `parametrization` (u-muP with an
  untied head, as it requires), with a constant rate `lr`, no warm-up, the layers unrolled."""
  config = copy.deepcopy(config)
  with config.unlocked():
    config_lib.apply_overrides(config, {
        "model.parametrization": parametrization, "model.d_model": width,
        "model.d_ff": 4 * width, "model.num_heads": max(1, width // head_dim),
        "model.scan_layers": False, "optimizer.learning_rate": lr,
        "optimizer.warmup_steps": 0, "optimizer.schedule": "constant",
        "model.tie_embeddings": (config.model.tie_embeddings
                                 and not parametrizations.get(parametrization).untied_head)})
  return config


def fixed_batch(config, seed: int = 0) -> dict:
  """One batch of random tokens (and, for an encoder, a fixed mask of data.mask_prob of the
  positions), the same for every width."""
  rng = np.random.default_rng(seed)
  shape = (config.train.batch_size, config.model.max_len)
  batch = {"tokens": jnp.asarray(rng.integers(0, config.model.vocab_size, shape), jnp.int32)}
  if not config.model.causal:
    mask = rng.random(shape) < config.data.mask_prob
    mask[:, 0] = True  # at least one predicted position a row
    batch["mask"] = jnp.asarray(mask)
  return batch


def _layer_outputs(cfg):
  """params, tokens, mask -> [num_layers + 1] arrays: each block's output and the logits."""
  model = model_lib.Transformer(cfg)

  def outputs(params, tokens, mask):
    logits, state = model.apply({"params": params}, tokens, mask, capture_intermediates=(
        lambda module, name: name == "__call__" and module.name is not None
        and module.name.startswith("layer_")), mutable=["intermediates"])
    found = state["intermediates"]
    return [found[f"layer_{i}"]["__call__"][0] for i in range(cfg.num_layers)] + [logits]
  return jax.jit(outputs)


def _rms(x) -> float:
  return float(jnp.sqrt(jnp.mean(jnp.square(jnp.asarray(x, jnp.float32)))))


def measure(config, parametrization: str, widths, steps: int = 10, lr: float = 1e-2,
            head_dim: int = 16, progress=None) -> list:
  """Rows {parametrization, width, step, layer, quantity, rms} for steps 0..`steps` at every
  width: layer "layer_<i>" (a block's output) or "logits"."""
  rows = []
  for width in widths:
    wide = width_config(config, parametrization, width, head_dim, lr)
    cfg = model_lib.ModelConfig.create(wide.model)
    values = jax.tree.map(np.asarray, per_run.run_values(wide))
    state = steps_lib.unboxed(jax.jit(lambda v: steps_lib.init_state(wide, v))(values))
    step = jax.jit(steps_lib.make_train_step(wide))
    outputs = _layer_outputs(cfg)
    batch = fixed_batch(wide)
    names = [f"layer_{i}" for i in range(cfg.num_layers)] + ["logits"]
    first = outputs(state.params, batch["tokens"], batch.get("mask"))
    for t in range(steps + 1):
      if t:
        state, _ = step(state, batch)
      now = first if t == 0 else outputs(state.params, batch["tokens"], batch.get("mask"))
      for name, before, after in zip(names, first, now):
        rows.append({"parametrization": parametrization, "width": width, "step": t,
                     "layer": name, "quantity": "output", "rms": _rms(after)})
        rows.append({"parametrization": parametrization, "width": width, "step": t,
                     "layer": name, "quantity": "update", "rms": _rms(after - before)})
    if progress is not None:
      progress(parametrization, width)
  return rows
