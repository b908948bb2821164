"""The default configuration: every field a run reads, with its default, in one place.

Config files under `configs/` start from `default_config()` and change what their study needs
(big_vision style: `get_config(arg)`), and the command line overrides any field with
`--config.a.b=value`.
"""

import ml_collections

from normstudy.errors import UserError


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
  data.name = "synthetic"  # synthetic | text_files | a TFDS text dataset (lm1b, c4/en, ...)
  data.data_dir = ml_collections.config_dict.placeholder(str)  # None: the TFDS default.
  data.files = ""  # Glob of UTF-8 text files for name=text_files.
  data.validation_fraction = 0.05  # text_files: the tail of the corpus held out.
  data.seed = 0  # Generator seed of the synthetic language.
  data.branching = 8  # Synthetic language: successors per token.
  data.train_tokens = 2**20
  data.validation_tokens = 2**16
  # TFDS catalog datasets: the text feature, the held-out split ("" = validation, else test),
  # and the tokenizer: "bytes", "train" (a SentencePiece model trained from the training split on
  # first use and saved beside the data), or the path of a SentencePiece .model.
  data.text_feature = "text"
  data.validation_split = ""
  data.tokenizer = "bytes"
  data.tokenizer_train_bytes = 2**24
  data.mask_prob = 0.65  # Encoders: fraction of positions that start a masked span (HuBERT).
  data.mask_length = 5

  # Device mesh (normstudy.sharding): one size may be -1, the remaining devices.
  config.mesh = mesh = ml_collections.ConfigDict()
  mesh.data = -1
  mesh.fsdp = 1
  mesh.tensor = 1

  config.train = train = ml_collections.ConfigDict()
  train.num_steps = 1000
  train.batch_size = 16
  train.seed = 0
  train.log_every = 1
  train.eval_every = 100
  train.eval_steps = 4
  train.checkpoint_every = 200
  train.max_to_keep = 2
  # Per-layer telemetry (attention-logit max, activation RMS, gradient/update/parameter norms)
  # every this many steps, by a second compiled step; 0 = off.
  train.telemetry_every = 0
  # float32/bfloat16 steps with a non-finite gradient: "halt" (stop, the newest checkpoint is the
  # last good state) or "skip" (drop the update; halt after max_consecutive_skips in a row).
  # float16 always uses the loss scaler's skip and halts when the scale would pass min_scale.
  train.on_nonfinite = "halt"
  train.max_consecutive_skips = 10
  return config


def _choices():
  # Imported here: the registries live with the code that uses them.
  from normstudy import model, optimizer, placements
  return {
      "model.placement": placements.names(),
      "model.norm": tuple(sorted(model.NORMS)),
      "model.dtype": tuple(model.DTYPES),
      "model.position_embedding": model.POSITION_EMBEDDINGS,
      "optimizer.name": optimizer.OPTIMIZERS,
      "optimizer.schedule": optimizer.SCHEDULES,
      "train.on_nonfinite": ("halt", "skip"),
  }


# (field, test, what is allowed): each checked in order, the first failure reported.
_RANGES = (
    ("model.num_layers", lambda v: v >= 1, "an integer >= 1"),
    ("model.d_model", lambda v: v >= 1, "an integer >= 1"),
    ("model.num_heads", lambda v: v >= 1, "an integer >= 1"),
    ("model.d_ff", lambda v: v >= 1, "an integer >= 1"),
    ("model.vocab_size", lambda v: v >= 2, "an integer >= 2"),
    ("model.max_len", lambda v: v >= 2, "an integer >= 2"),
    ("model.norm_eps", lambda v: v > 0, "a number > 0"),
    ("model.attention_relax", lambda v: v >= 0, "0 (off) or a number > 0"),
    ("model.dropout", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("optimizer.learning_rate", lambda v: v > 0, "a number > 0"),
    ("optimizer.end_learning_rate", lambda v: v >= 0, "a number >= 0"),
    ("optimizer.b1", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("optimizer.b2", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("optimizer.eps", lambda v: v > 0, "a number > 0"),
    ("optimizer.weight_decay", lambda v: v >= 0, "a number >= 0"),
    ("optimizer.warmup_steps", lambda v: v >= 0, "an integer >= 0"),
    ("optimizer.clip_norm", lambda v: v is None or v >= 0, "None or 0 (off), or a number > 0"),
    ("optimizer.loss_scale.initial_scale", lambda v: v > 0, "a number > 0"),
    ("optimizer.loss_scale.growth_interval", lambda v: v >= 1, "an integer >= 1"),
    ("optimizer.loss_scale.min_scale", lambda v: v > 0, "a number > 0"),
    ("data.mask_prob", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    ("data.mask_length", lambda v: v >= 1, "an integer >= 1"),
    ("data.branching", lambda v: v >= 1, "an integer >= 1"),
    ("data.train_tokens", lambda v: v >= 1, "an integer >= 1"),
    ("data.validation_tokens", lambda v: v >= 1, "an integer >= 1"),
    ("data.validation_fraction", lambda v: 0 < v < 1, "a number in (0, 1)"),
    ("train.num_steps", lambda v: v >= 1, "an integer >= 1"),
    ("train.batch_size", lambda v: v >= 1, "an integer >= 1"),
    ("train.log_every", lambda v: v >= 1, "an integer >= 1"),
    ("train.eval_every", lambda v: v >= 0, "0 (never) or an integer >= 1"),
    ("train.eval_steps", lambda v: v >= 1, "an integer >= 1"),
    ("train.checkpoint_every", lambda v: v >= 0, "0 (only at the end) or an integer >= 1"),
    ("train.max_to_keep", lambda v: v >= 1, "an integer >= 1"),
    ("train.max_consecutive_skips", lambda v: v >= 1, "an integer >= 1"),
    ("train.telemetry_every", lambda v: v >= 0, "0 (off) or an integer >= 1"),
)


def get_field(config, dotted: str):
  for key in dotted.split("."):
    config = config[key]
  return config


def validate(config, data_parallel: int = 1) -> None:
  """Raises ConfigError naming the first bad field, its value and what is allowed.

  `data_parallel` is the number of ways the batch is split (the devices on the data axes)."""
  from normstudy import data as data_lib
  for field, allowed in _choices().items():
    value = get_field(config, field)
    if value not in allowed:
      raise ConfigError(f"config.{field}={value!r} is not allowed; allowed: {', '.join(allowed)}")
  for field, test, allowed in _RANGES:
    value = get_field(config, field)
    try:
      ok = test(value)
    except TypeError:
      ok = False
    if not ok:
      raise ConfigError(f"config.{field}={value!r} is not allowed; allowed: {allowed}")
  model, data, train = config.model, config.data, config.train
  if data.name not in data_lib.DATASETS and not data_lib.is_catalog_dataset(data.name):
    raise ConfigError(f"config.data.name={data.name!r} is not allowed; allowed: "
                      f"{', '.join(data_lib.DATASETS)} or a TFDS catalog dataset with a text "
                      "feature (lm1b, c4/en, ...)")
  if data.name not in data_lib.DATASETS and data.tokenizer == "bytes" and model.vocab_size < 256:
    raise ConfigError(f"config.model.vocab_size={model.vocab_size} is too small for "
                      "config.data.tokenizer='bytes'; allowed: >= 256")
  if model.d_model % model.num_heads:
    raise ConfigError(f"config.model.num_heads={model.num_heads} does not divide "
                      f"config.model.d_model={model.d_model}")
  if model.position_embedding == "conv" and model.causal:
    raise ConfigError("config.model.position_embedding='conv' sees both sides of a position; "
                      "allowed only with config.model.causal=False")
  if model.position_embedding == "conv" and model.d_model % model.conv_pos_groups:
    raise ConfigError(f"config.model.conv_pos_groups={model.conv_pos_groups} does not divide "
                      f"config.model.d_model={model.d_model}")
  if data.mask_length > model.max_len:
    raise ConfigError(f"config.data.mask_length={data.mask_length} is longer than "
                      f"config.model.max_len={model.max_len}")
  if data.name == "text_files":
    if not data.files:
      raise ConfigError("config.data.files is empty; name=text_files needs a glob of text files")
    if model.vocab_size < 256:
      raise ConfigError(f"config.model.vocab_size={model.vocab_size} is too small for byte-level "
                        "text_files; allowed: >= 256")
  if data.name == "synthetic" and data.branching > model.vocab_size:
    raise ConfigError(f"config.data.branching={data.branching} exceeds "
                      f"config.model.vocab_size={model.vocab_size}")
  if train.batch_size % data_parallel:
    raise ConfigError(f"config.train.batch_size={train.batch_size} is not divisible by the "
                      f"{data_parallel} data-parallel devices")


class ConfigError(UserError):
  """A config value outside what normstudy accepts."""
