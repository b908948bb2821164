"""The seed figure's four runs, in miniature: `--config=configs/seed_figure.py:<variant>`.

MERT's stability study (Li et al. 2023) trained a 24-layer encoder by masked prediction in fp16
with dynamic loss scaling and compared block designs and clipping. Here the same recipe (Adam
betas (0.9, 0.98), eps 1e-6, weight decay 0.01, warm-up then polynomial decay, fp16 with fairseq's
loss scaler, span masking) runs on a model small enough that all four runs finish in a few
minutes on two CPU cores. `normstudy.study` runs every name in VARIANTS.
"""

from normstudy import config as config_lib

VARIANTS = (
    "pre_norm_clip10",
    "pre_norm_clip1",
    "post_norm_deepnorm_clip1",
    "pre_norm_attn_relax_clip1",
)

LABELS = {
    "pre_norm_clip10": "Pre-Norm | Gradient Clip=10 | Run 1",
    "pre_norm_clip1": "Pre-Norm | Gradient Clip=1 | Run 2",
    "post_norm_deepnorm_clip1": "Post-Norm | DeepNorm | Gradient Clip=1",
    "pre_norm_attn_relax_clip1": "Pre-Norm | Attention Relax | Gradient Clip=1",
}


def get_config(variant: str = "pre_norm_clip1"):
  if variant not in LABELS:
    raise ValueError(
        f"unknown variant {variant!r} of configs/seed_figure.py; variants: {', '.join(VARIANTS)}")
  config = config_lib.default_config()
  config.label = LABELS[variant]

  model = config.model
  model.causal = False  # MERT: encoder, masked prediction
  model.num_layers = 4
  model.d_model = 64
  model.num_heads = 4
  model.d_ff = 256
  model.vocab_size = 256
  model.max_len = 64
  model.dtype = "float16"
  model.placement = "pre_ln"
  model.attention_relax = 0.0
  # MERT (like wav2vec2/HuBERT) adds convolutional relative positions; with them a tiny encoder
  # learns masked prediction within a few hundred steps (absolute positions need thousands).
  model.position_embedding = "conv"
  # Four layers compile quickly unrolled, and XLA:CPU runs an unrolled stack ~20% faster than a
  # scanned one (benchmarks/throughput.py).
  model.scan_layers = False

  opt = config.optimizer
  opt.name = "adamw"  # fairseq's adam decays decoupled from the gradient
  opt.b1, opt.b2, opt.eps = 0.9, 0.98, 1e-6
  opt.weight_decay = 0.01
  opt.learning_rate = 3e-3  # MERT: 1.5e-3 for a 24-layer model; the miniature takes more
  opt.schedule = "polynomial"
  opt.warmup_steps = 80
  opt.end_learning_rate = 0.0
  opt.clip_norm = 1.0
  # fairseq's window is 2^14 updates; a 1000-step run needs a shorter one to show the scaler's
  # growth/collapse cycle at all.
  opt.loss_scale.growth_interval = 50

  # MERT masks spans of 5 frames from 65% of start positions; on 64-token rows of a first-order
  # Markov chain that leaves little to predict from, so the miniature masks shorter spans.
  config.data.mask_prob = 0.3
  config.data.mask_length = 2

  train = config.train
  train.num_steps = 1000
  train.batch_size = 16
  train.log_every = 1
  train.eval_every = 100
  train.eval_steps = 4
  train.checkpoint_every = 250
  train.telemetry_every = 10

  if variant == "pre_norm_clip10":
    opt.clip_norm = 10.0
  elif variant == "post_norm_deepnorm_clip1":
    model.placement = "deepnorm"
  elif variant == "pre_norm_attn_relax_clip1":
    model.attention_relax = 32.0
  return config
