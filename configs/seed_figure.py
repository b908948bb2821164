"""The seed figure's four runs, in miniature: `--config=configs/seed_figure.py:<variant>`.

MERT's stability study (Li et al. 2023, arXiv:2306.00107) trained a 24-layer encoder by masked
prediction in fp16 with fairseq's dynamic loss scaling and compared block designs and clipping.
This file keeps the recipe as fairseq and MERT run it (fairseq's Adam, betas (0.9, 0.98), eps
1e-6, weight decay 0.01 on every parameter, warm-up then polynomial decay, BERT init, biases,
exact GELU in float32, MERT's input LayerNorm for the Post-LN encoder, convolutional positions,
span masking) on a model small enough that all four runs finish in minutes on two CPU cores.

EXPERIMENT declares what the file runs (normstudy.core.experiment): its arms, {name: (label,
{dotted.field: value})}, applied through the same override mechanism as the command line. Labels
are templates (normstudy.core.labels): "{auto}" is described from the config, so an override
shows in the legend. `normstudy.study` runs the paper's four over three seeds (study_arms,
seeds: `make study`); `normstudy.sweep` runs all five over its axes with its settings (`make
sensitivity`): the fifth arm, DeepNorm with attention relax, puts the relax where attention
scores overflow, the only place it can act.
"""

from normstudy.core import config as config_lib
from normstudy.core.experiment import Experiment

_ARMS = {
    "pre_norm_clip10": ("{auto} | Run 1", {"optimizer.clip_norm": 10.0}),
    "pre_norm_clip1": ("{auto} | Run 2", {}),
    "post_norm_deepnorm_clip1": ("{auto}", {"model.placement": "deepnorm",
                                            "model.input_norm": True}),
    "pre_norm_attn_relax_clip1": ("{auto}", {"model.attention_relax": 32.0}),
    "post_norm_deepnorm_attn_relax_clip1": ("{auto}", {"model.placement": "deepnorm",
                                                       "model.input_norm": True,
                                                       "model.attention_relax": 32.0}),
    # Controls for the DeepNorm arm, which differs from Pre-LN in three ways at once: the input
    # LayerNorm on the embedding output, the Post-LN wiring, and DeepNorm's alpha/beta. Pre-LN
    # with the input norm isolates the norm; Post-LN (alpha = beta = 1) with it, the wiring.
    "pre_norm_input_norm_clip1": ("{auto} | Input Norm", {"model.input_norm": True}),
    "post_norm_input_norm_clip1": ("{auto} | Input Norm", {"model.placement": "post_ln",
                                                           "model.input_norm": True}),
}
# The seed figure's sensitivity sweep: the paper's four arms and DeepNorm with relax.
_SWEEP_ARMS = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
                  "pre_norm_attn_relax_clip1", "post_norm_deepnorm_attn_relax_clip1")
# The seed figure's four runs.
_STUDY_ARMS = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
                  "pre_norm_attn_relax_clip1")

# The learning-rate sensitivity study (Wortsman et al. 2023): every arm over these axes. The
# recipe's own learning rate is 3e-3; the grid spans where every arm trains to where the probe
# saw fp16 loss-scale collapse in every arm (3e-1). A depth axis is one flag away:
# --axis=model.num_layers=4,12 (docs/results.md, "Learning-rate sensitivity").
_AXES = {
    "optimizer.learning_rate": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1],
    "train.seed": [0, 1, 2],
}
# What a sweep of this file changes in every run, so that its 90 runs fit in `make
# sensitivity`'s half hour on 2 CPU cores: 200-step runs (warm-up and decay scaled with them),
# records every 5 steps, telemetry (attention logits) every 25.
# `--config.train.num_steps=1000 --config.optimizer.warmup_steps=80` restores the recipe's
# length (about five times as long).
_SETTINGS = {
    # A curve of a sweep is many runs: its legend is the arm's description, without the seed
    # figure's "Run 1"/"Run 2".
    "label": "{auto}",
    "train.num_steps": 200,
    "optimizer.warmup_steps": 20,
    "train.log_every": 5,
    "train.eval_every": 100,
    "train.telemetry_every": 25,
    "train.checkpoint_every": 100,
}


# The seed figure over seeds: one seed per arm in float16 is chaotic across CPU kinds (a loss
# spike on one machine is none on another), so each arm is drawn as its median and range.


def base_config():
  """The recipe every variant shares (Pre-LN, clip 1)."""
  config = config_lib.default_config()
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
  # fairseq/MERT: init_bert_params, biases everywhere, exact GELU in float32.
  model.init = "bert"
  model.use_bias = True
  model.activation = "gelu"
  # MERT (like wav2vec2/HuBERT) adds convolutional relative positions; with them a tiny encoder
  # learns masked prediction within a few hundred steps (absolute positions need thousands).
  model.position_embedding = "conv"
  # scan_layers stays None: the DeepNorm arm's float16 stack is scanned (unrolled it ran at
  # half the speed), the Pre-LN arms' unrolled (docs/throughput.md).

  opt = config.optimizer
  opt.name = "adam_fairseq"
  opt.b1, opt.b2, opt.eps = 0.9, 0.98, 1e-6
  opt.weight_decay = 0.01
  opt.learning_rate = 3e-3  # MERT: 1.5e-3 for a 24-layer model; the miniature takes more
  opt.schedule = "polynomial"
  opt.warmup_steps = 80
  opt.end_learning_rate = 0.0
  opt.clip_norm = 1.0
  # fairseq's window is 2^14 updates (MERT-330M's effective window was 2^14 / 512 = 32); a
  # 1000-step run needs a short one to show the scaler's growth/collapse cycle at all.
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
  return config


EXPERIMENT = Experiment(base=base_config, default_arm="pre_norm_clip1", arms=_ARMS,
                        sweep_arms=_SWEEP_ARMS, study_arms=_STUDY_ARMS, axes=_AXES,
                        settings=_SETTINGS, seeds=(0, 1, 2))

get_config = EXPERIMENT.get_config
