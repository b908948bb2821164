"""Ten stability techniques against a Pre-LN baseline, over learning rates and seeds.

  make techniques    # python -m normstudy.sweep --config=configs/techniques.py --workdir=...

The model is the seed figure's miniature (configs/seed_figure.py: a 4-layer, 64-wide encoder trained
by masked prediction in float16 with fairseq's loss scaler and schedule) with Pre-LN, clip 1 and
optax's AdamW (norm gains, biases and the techniques' scales not decayed); each arm turns on one
technique, as its placement or as an option on top of Pre-LN (docs/reference.md, "Stability
techniques"). The seed figure's sensitivity study showed where this model fails in float16: that is
where a technique can widen the stable range, so the grid covers it. The analysis ranks the arms by
Wortsman et al.'s LR sensitivity (normstudy.analysis).
"""

from configs import seed_figure  # the recipe this study varies
from normstudy.core import config as config_lib

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


def base_config():
  """The seed recipe with optax's Adam with decoupled decay and the model's decay mask, so the
  gains and scales the techniques add are not decayed (fairseq's Adam, the seed recipe's,
  decays every parameter)."""
  config = seed_figure.base_config()
  config.optimizer.name = "adamw"
  return config


def get_config(variant: str = "baseline"):
  return config_lib.variant_config(VARIANTS, base_config, variant, "configs/techniques.py")
