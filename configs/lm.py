"""A decoder-only causal language model for LM stability studies: `--config=configs/lm.py[:size]`.

Sizes: `tiny` (CPU smoke runs), `small` (the default), `base`. Override anything on the command
line, e.g. `--config.model.placement=sandwich_ln --config.optimizer.clip_norm=0`.
"""

from normstudy.core import config as config_lib
from normstudy.core.experiment import Experiment

SIZES = {
    # name: (num_layers, d_model, num_heads, d_ff, max_len, batch_size)
    "tiny": (2, 64, 4, 256, 64, 16),
    "small": (6, 256, 4, 1024, 256, 16),
    "base": (12, 768, 12, 3072, 1024, 64),
}


_SIZES = {
    size: (f"LM {size} | Pre-LN", {
        "model.num_layers": layers, "model.d_model": d_model, "model.num_heads": heads,
        "model.d_ff": d_ff, "model.max_len": max_len, "train.batch_size": batch_size})
    for size, (layers, d_model, heads, d_ff, max_len, batch_size) in SIZES.items()}


def base_config():
  """A causal Pre-LN decoder in float32 with AdamW, a cosine schedule and clip 1."""
  config = config_lib.default_config()
  config.model.update(causal=True, vocab_size=256, placement="pre_ln", dtype="float32")
  config.optimizer.update(
      name="adamw", learning_rate=1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1,
      warmup_steps=200, schedule="cosine", end_learning_rate=1e-4, clip_norm=1.0)
  config.train.update(num_steps=2000, eval_every=200, checkpoint_every=500)
  return config


# The sizes as the experiment's arms; a study or sweep of this file trains the size --config
# names, by default `small` alone.
EXPERIMENT = Experiment(base=base_config, arms=_SIZES, default_arm="small", arm_kind="size",
                        study_arms=("small",), sweep_arms=("small",))

get_config = EXPERIMENT.get_config
