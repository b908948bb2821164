"""Ten stability techniques against a Pre-LN baseline, over learning rates and seeds.

  make techniques    # python -m normstudy.sweep --config=configs/techniques.py --workdir=...

The model is the seed figure's miniature (configs/seed_figure.py: a 4-layer, 64-wide encoder
trained by masked prediction in float16 with fairseq's loss scaler and schedule) with Pre-LN,
clip 1 and optax's AdamW (norm gains, biases and the techniques' scales not decayed); each arm turns on one technique, as its placement or as an option on top of
Pre-LN (README, "Stability techniques"). The seed figure's sensitivity study showed where this
model fails in float16: that is where a technique can widen the stable range, so the grid covers
it. The analysis ranks the arms by Wortsman et al.'s LR sensitivity (normstudy.analysis).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_figure  # noqa: E402  (the recipe this study varies)

from normstudy import config as config_lib  # noqa: E402

# name: (label, {dotted.field: value}); labels name the technique from the config ("{auto}").
VARIANTS = {
    "baseline": ("{auto}", {}),
    "qk_norm": ("{auto}", {"model.qk_norm": "layernorm"}),
    "z_loss": ("{auto}", {"loss.z_loss": 1e-4}),
    "sub_ln": ("{auto}", {"model.placement": "sub_ln"}),
    "peri_ln": ("{auto}", {"model.placement": "peri_ln"}),
    "mix_ln": ("{auto}", {"model.placement": "mix_ln"}),
    "rezero": ("{auto}", {"model.placement": "rezero"}),
    "layer_scale": ("{auto}", {"model.layer_scale": 0.1}),  # CaiT: 0.1 for shallow stacks
    "emb_grad_shrink": ("{auto}", {"model.emb_grad_shrink": 0.1}),  # GLM-130B's alpha
    "softcap": ("{auto}", {"model.attn_softcap": 50.0, "model.output_softcap": 30.0}),  # Gemma 2
    "fp32_scores": ("{auto}", {"model.attention_scores_dtype": "float32"}),
}

# From where the baseline learns (3e-3) to past where it dies in float16 (3e-1: attention-score
# overflow after the loss scale collapses, in the seed figure's sensitivity study), two seeds.
SWEEP = {
    "optimizer.learning_rate": [3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0],
    "train.seed": [0, 1],
}
# As the seed figure's sweep (sparse records, telemetry every 25 steps), with 120-step runs so
# 11 arms x 12 runs fit `make techniques`'s 30 minutes on 2 CPU cores.
SWEEP_SETTINGS = {**seed_figure.SWEEP_SETTINGS, "train.num_steps": 120,
                  "optimizer.warmup_steps": 12}


def get_config(variant: str = "baseline"):
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r} of configs/techniques.py; variants: "
                     f"{', '.join(VARIANTS)}")
  label, settings = VARIANTS[variant]
  config = seed_figure.base_config()
  # optax's Adam with decoupled decay and the model's decay mask, so the gains and scales the
  # techniques add are not decayed (fairseq's Adam, the seed recipe's, decays every parameter).
  config.optimizer.name = "adamw"
  config.label = label
  config_lib.apply_overrides(config, settings)
  return config
