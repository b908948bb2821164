"""The default configuration: every field a run reads, with its default, in one place.

Config files under `configs/` start from `default_config()` and change what their study needs
(big_vision style: `get_config(arg)`), and the command line overrides any field with
`--config.a.b=value`.
"""

import ml_collections


def default_config() -> ml_collections.ConfigDict:
  """Returns a config with every field normstudy reads, set to its default."""
  config = ml_collections.ConfigDict()
  config.label = ""  # Legend label in figures; empty means the run's directory name.

  config.model = model = ml_collections.ConfigDict()
  model.num_layers = 4
  model.d_model = 128
  model.num_heads = 4
  model.d_ff = 512
  model.vocab_size = 256
  model.max_len = 128
  model.causal = True  # False: bidirectional encoder trained by masked prediction.
  model.placement = "pre_ln"  # A name registered in normstudy.placements.
  model.norm = "layernorm"  # layernorm | rmsnorm
  model.norm_eps = 1e-5
  model.attention_relax = 0.0  # 0 = off, else the PB-Relax alpha (MERT uses 32).
  model.dtype = "float32"  # Compute dtype: float32 | bfloat16 | float16. Parameters stay float32.
  model.scan_layers = True
  model.dropout = 0.0
  model.tie_embeddings = True
  model.position_embedding = "sinusoidal"  # sinusoidal (fixed) | learned | conv (encoders)
  model.conv_pos_width = 5  # conv: kernel width over the sequence
  model.conv_pos_groups = 4  # conv: channel groups (wav2vec2 uses 16)

  config.optimizer = opt = ml_collections.ConfigDict()
  opt.name = "adamw"  # adam (L2 added to the gradient) | adamw (decoupled decay)
  opt.learning_rate = 1e-3
  opt.b1 = 0.9
  opt.b2 = 0.98
  opt.eps = 1e-6
  opt.weight_decay = 0.01
  opt.warmup_steps = 100
  opt.schedule = "polynomial"  # constant | linear | cosine | polynomial (power 1 as fairseq)
  opt.end_learning_rate = 0.0
  opt.clip_norm = 1.0  # None or 0 = no clipping.
  opt.loss_scale = ls = ml_collections.ConfigDict()
  # fairseq's fp16 defaults; only used when model.dtype is float16.
  ls.initial_scale = 128.0
  ls.growth_interval = 2**14
  ls.min_scale = 1e-4

  config.data = data = ml_collections.ConfigDict()
  data.name = "synthetic"  # synthetic | text_files
  data.data_dir = ml_collections.config_dict.placeholder(str)  # None: the TFDS default.
  data.files = ""  # Glob of UTF-8 text files for name=text_files.
  data.validation_fraction = 0.05  # text_files: the tail of the corpus held out.
  data.seed = 0  # Generator seed of the synthetic language.
  data.branching = 8  # Synthetic language: successors per token.
  data.train_tokens = 2**20
  data.validation_tokens = 2**16
  data.mask_prob = 0.65  # Encoders: fraction of positions that start a masked span (HuBERT).
  data.mask_length = 5

  config.train = train = ml_collections.ConfigDict()
  train.num_steps = 1000
  train.batch_size = 16
  train.seed = 0
  train.log_every = 1
  train.eval_every = 100
  train.eval_steps = 4
  train.checkpoint_every = 200
  train.max_to_keep = 2
  return config
