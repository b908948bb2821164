"""The configuration schema: every field a run reads, with its default, defined once.

Config files under `configs/` start from `default_config()` and change what their study needs
(big_vision style: `get_config(arg)`), and the command line overrides any field with
`--config.a.b=value`. Variants, sweep axes and study overrides go through `override()`, the same
typed assignment the command line uses. `ModelConfig` (normstudy.model) is derived from
`default_config().model`, so a new model field costs one line here.

Validation is split by what it needs to know: `check_ranges` (here) checks each field on its own;
`normstudy.validation` adds the registered names and the rules across fields.
"""

import contextlib
import math

import ml_collections

from normstudy import errors
from normstudy import techniques


def _model() -> ml_collections.ConfigDict:
  """config.model: the transformer (placement, sizes, precision, positions)."""
  model = ml_collections.ConfigDict()
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
  # A norm on the embedding output before layer 0 (MERT's Post-LN encoder, wav2vec2 with
  # layer_norm_first=False); placements such as peri_ln have one of their own.
  model.input_norm = False
  model.activation = "gelu"  # gelu (exact erf) | gelu_tanh | relu; GELU runs in float32
  model.init = "xavier"  # xavier | bert (normal(0.02), fairseq's init_bert_params)
  model.use_bias = False  # biases on q, k, v, out, fc1, fc2 and the position conv
  # softmax | none: no attention sublayer (the blocks are MLPs; only a conv position embedding
  # mixes tokens), the control that shows whether a language needs attention (configs/context.py)
  model.attention = "softmax"
  model.attention_relax_form = "pb_relax"  # pb_relax (CogView) | after_product (MERT's code)
  model.mix_ln_fraction = 0.25  # mix_ln: the share of layers (rounded up) that are Post-LN
  # peri_ln: its LayerNorm on the embedding output (Kim et al. 2025); False keeps only the
  # sublayers' input and output norms and the final norm.
  model.peri_ln_embedding_norm = True
  model.dtype = "float32"  # Compute dtype: float32 | bfloat16 | float16. Parameters stay float32.
  # Run the layers with nn.scan (True), unrolled (False), or None: by the rule measured on
  # XLA:CPU (normstudy.model.scans): scan stacks deeper than 6 layers and 16-bit stacks whose
  # residual path goes through norms (Post-LN family); unroll the rest.
  model.scan_layers = ml_collections.config_dict.placeholder(bool)
  # Rematerialisation of each block in the backward pass (normstudy.model.REMAT_POLICIES): none
  # (keep every activation), block (keep only each block's input, recompute the rest), dots
  # (keep the matmul outputs, recompute the elementwise work between them).
  model.remat = "none"
  model.dropout = 0.0
  model.tie_embeddings = True
  model.position_embedding = "sinusoidal"  # sinusoidal (fixed) | learned | conv (encoders)
  model.conv_pos_width = 5  # conv: kernel width over the sequence
  model.conv_pos_groups = 4  # conv: channel groups (wav2vec2 uses 16)
  return model


def _optimizer() -> ml_collections.ConfigDict:
  """config.optimizer: clipping, Adam, weight decay, the schedule, fp16 loss scaling."""
  opt = ml_collections.ConfigDict()
  # adamw: optax Adam, decay decoupled, norms and biases not decayed | adam: L2 added to the
  # gradient | adam_fairseq: fairseq's Adam (eps outside the bias correction, every parameter
  # decayed)
  opt.name = "adamw"
  opt.learning_rate = 1e-3
  opt.b1 = 0.9
  opt.b2 = 0.98
  opt.eps = 1e-6
  opt.weight_decay = 0.01
  opt.warmup_steps = 100
  opt.schedule = "polynomial"  # constant | linear | cosine | polynomial
  opt.power = 1.0  # polynomial: fairseq's polynomial_decay power (1 = linear decay)
  opt.end_learning_rate = 0.0
  opt.clip_norm = 1.0  # None or 0 = no clipping.
  opt.loss_scale = ls = ml_collections.ConfigDict()
  # fairseq's fp16 defaults; only used when model.dtype is float16.
  ls.initial_scale = 128.0
  ls.growth_interval = 2**14
  ls.min_scale = 1e-4
  return opt


def _data() -> ml_collections.ConfigDict:
  """config.data: the dataset, its size and, for encoders, the masking."""
  data = ml_collections.ConfigDict()
  data.name = "synthetic"  # synthetic | text_files | a TFDS text dataset (lm1b, c4/en, ...)
  data.data_dir = ml_collections.config_dict.placeholder(str)  # None: the TFDS default.
  data.files = ""  # Glob of UTF-8 text files for name=text_files.
  data.validation_fraction = 0.05  # text_files: the tail of the corpus held out.
  data.seed = 0  # Generator seed of the synthetic language.
  data.branching = 8  # Synthetic language: successors per token.
  # Synthetic language: 1 is the Markov chain; D > 1 the context language, D dialects of it
  # (one per document, hidden), each the chain mixed with dialect_weight of a chain of its own
  # (normstudy.synthetic; configs/context.py).
  data.dialects = 1
  data.dialect_weight = 0.5
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
  return data


def _mesh() -> ml_collections.ConfigDict:
  """config.mesh (normstudy.sharding): axis sizes; one may be -1, the remaining devices."""
  mesh = ml_collections.ConfigDict()
  mesh.runs = 1  # the K runs of one program (a sweep), each on its own slice of devices
  mesh.data = -1
  mesh.fsdp = 1
  mesh.tensor = 1
  return mesh


def _train() -> ml_collections.ConfigDict:
  """config.train: length, records, checkpoints, telemetry and the non-finite policy."""
  train = ml_collections.ConfigDict()
  train.num_steps = 1000
  # True: num_steps counts train steps, skipped fp16 overflow steps included. False: a run stops
  # after num_steps applied updates, as fairseq's max_update does.
  train.count_skipped_steps = True
  train.batch_size = 16
  train.seed = 0
  train.log_every = 1
  train.eval_every = 100
  train.eval_steps = 4
  # Which eval set: validation rows 0 .. eval_steps * batch_size - 1, in order, masked (encoder)
  # by this seed, so every run with the same eval_seed is evaluated on the same rows and masks
  # whatever its train.seed, and arms and seeds compare on the same data. -1: each run's masks
  # from its own train.seed (how runs before 2026-12 were evaluated; 0 gives seed 0's set).
  train.eval_seed = 0
  train.checkpoint_every = 200
  train.max_to_keep = 2
  # TensorBoard event files beside metrics.jsonl (clu's SummaryWriter). False spares the import
  # of TensorFlow (seconds of CPU per process); metrics.jsonl, which the analysis reads, is always
  # written.
  train.tensorboard = True
  # A Weights & Biases project to send every record to as well ("" = off; needs the `wandb`
  # extra: pip install -e '.[wandb]'). WANDB_MODE=offline keeps the runs in <run>/wandb/.
  train.wandb_project = ""
  # Per-layer telemetry (attention-logit max, activation RMS, gradient/update/parameter norms)
  # every this many steps, by a second compiled step; 0 = off.
  train.telemetry_every = 0
  # float32/bfloat16 steps with a non-finite gradient: "halt" (stop, the newest checkpoint is the
  # last good state) or "skip" (drop the update; halt after max_consecutive_skips in a row).
  # float16 always uses the loss scaler's skip and halts when the scale would pass min_scale.
  # Steps at the start whose update size (||f(x; theta_t+1) - f(x; theta_t)|| on the first eval
  # batch, DeepNet's measure; normstudy.steps.update_size) is recorded as `update_size`; 0: off.
  train.update_size_steps = 0
  train.on_nonfinite = "halt"
  train.max_consecutive_skips = 10
  return train


def default_config() -> ml_collections.ConfigDict:
  """Returns a config with every field normstudy reads, set to its default."""
  config = ml_collections.ConfigDict()
  # Legend label. Empty or "{auto}": described from the config (placement, techniques, clip);
  # "{auto} | Run 2" adds to that; "{optimizer.clip_norm}"-style fields are filled in.
  config.label = ""
  config.model = _model()
  # The objective's auxiliary terms (normstudy.loss), each logged under its own key.
  config.loss = ml_collections.ConfigDict()
  config.optimizer = _optimizer()
  config.data = _data()
  config.mesh = _mesh()
  config.train = _train()
  # Stability techniques that combine with any placement, each at its off value
  # (normstudy.techniques; docs/reference.md, "Stability techniques").
  for technique in techniques.TECHNIQUES:
    *section, name = technique.field.split(".")
    get_field(config, ".".join(section))[name] = technique.off
  return config


# Fields whose allowed values are a fixed list. Extensible sets (placements, norms, activations,
# optimizers, ...) are registries in the modules that implement them (normstudy.validation).
CHOICES = {
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.position_embedding": ("sinusoidal", "learned", "conv"),
    "model.attention": ("softmax", "none"),
    "model.attention_relax_form": ("pb_relax", "after_product"),
    "model.init": ("xavier", "bert"),
    "model.remat": ("none", "block", "dots"),
    "train.on_nonfinite": ("halt", "skip"),
    **{t.field: t.allowed for t in techniques.TECHNIQUES if t.accepts is None},
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
    ("model.dropout", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("model.mix_ln_fraction", lambda v: 0 < v < 1, "a number in (0, 1)"),
    ("model.conv_pos_width", lambda v: v >= 1, "an integer >= 1"),
    ("model.conv_pos_groups", lambda v: v >= 1, "an integer >= 1"),
    ("optimizer.learning_rate", lambda v: v > 0, "a number > 0"),
    ("optimizer.end_learning_rate", lambda v: v >= 0, "a number >= 0"),
    ("optimizer.b1", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("optimizer.b2", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("optimizer.eps", lambda v: v > 0, "a number > 0"),
    ("optimizer.weight_decay", lambda v: v >= 0, "a number >= 0"),
    ("optimizer.warmup_steps", lambda v: v >= 0, "an integer >= 0"),
    ("optimizer.power", lambda v: v > 0, "a number > 0"),
    ("optimizer.clip_norm", lambda v: v is None or v >= 0, "None or 0 (off), or a number > 0"),
    ("optimizer.loss_scale.initial_scale", lambda v: v > 0, "a number > 0"),
    ("optimizer.loss_scale.growth_interval", lambda v: v >= 1, "an integer >= 1"),
    ("optimizer.loss_scale.min_scale", lambda v: v > 0, "a number > 0"),
    ("data.mask_prob", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    ("data.mask_length", lambda v: v >= 1, "an integer >= 1"),
    ("data.branching", lambda v: v >= 1, "an integer >= 1"),
    ("data.dialects", lambda v: v >= 1, "an integer >= 1"),
    ("data.dialect_weight", lambda v: 0 < v <= 1, "a number in (0, 1]"),
    ("data.train_tokens", lambda v: v >= 1, "an integer >= 1"),
    ("data.validation_tokens", lambda v: v >= 1, "an integer >= 1"),
    ("data.validation_fraction", lambda v: 0 < v < 1, "a number in (0, 1)"),
    ("train.seed", lambda v: 0 <= v < 2**31, "an integer in [0, 2^31)"),
    ("data.seed", lambda v: 0 <= v < 2**31, "an integer in [0, 2^31)"),
    ("train.num_steps", lambda v: v >= 1, "an integer >= 1"),
    ("train.batch_size", lambda v: v >= 1, "an integer >= 1"),
    ("train.log_every", lambda v: v >= 1, "an integer >= 1"),
    ("train.eval_every", lambda v: v >= 0, "0 (never) or an integer >= 1"),
    ("train.eval_steps", lambda v: v >= 1, "an integer >= 1"),
    ("train.eval_seed", lambda v: v >= -1, "-1 (each run's own train.seed) or an integer >= 0"),
    ("train.checkpoint_every", lambda v: v >= 0, "0 (only at the end) or an integer >= 1"),
    ("train.max_to_keep", lambda v: v >= 1, "an integer >= 1"),
    ("train.max_consecutive_skips", lambda v: v >= 1, "an integer >= 1"),
    ("train.telemetry_every", lambda v: v >= 0, "0 (off) or an integer >= 1"),
    ("train.update_size_steps", lambda v: v >= 0, "0 (off) or an integer >= 1"),
) + tuple((t.field, t.accepts, t.allowed) for t in techniques.TECHNIQUES if t.accepts)


def get_field(config, dotted: str):
  for key in dotted.split("."):
    config = config[key]
  return config


def override(config, dotted: str, value) -> None:
  """Sets `config.<dotted>` = value with the field's type checks, as `--config.<dotted>=value`
  does: an unknown field or a value of the wrong type is a ConfigError naming the field."""
  *parents, name = dotted.split(".")
  node = config
  for key in parents:
    if key not in node:
      raise errors.ConfigError(f"unknown config field {dotted!r}")
    node = node[key]
  if not hasattr(node, "keys") or name not in node:
    raise errors.ConfigError(f"unknown config field {dotted!r}")
  if isinstance(node[name], ml_collections.ConfigDict):
    raise errors.ConfigError(f"config.{dotted} is a section, not a field")
  try:
    with node.unlocked() if node.is_locked else contextlib.nullcontext():
      node[name] = value
  except (TypeError, ValueError) as e:
    raise errors.ConfigError(f"config.{dotted}={value!r}: {e}") from None


def apply_overrides(config, overrides: dict) -> None:
  for dotted, value in overrides.items():
    override(config, dotted, value)


def variant_config(variants: dict, base, variant: str, source: str, kind: str = "variant"):
  """The config of one row of a config file's table: `base()` (the config its rows share), then
  the row `variants[variant] = (label, {dotted.field: value})`: the label (a template,
  normstudy.labels) and the settings, applied as the command line applies overrides. Every
  config file's get_config is this over its own table. ValueError for a name the table lacks,
  naming `source` (the file) and the names it has (`kind`: what a row is called there)."""
  if variant not in variants:
    raise ValueError(f"unknown {kind} {variant!r} of {source}; {kind}s: {', '.join(variants)}")
  label, settings = variants[variant]
  config = base()
  config.label = label
  apply_overrides(config, settings)
  return config


def _float_fields(node, prefix=""):
  for key, value in node.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _float_fields(value, f"{prefix}{key}.")
    elif isinstance(value, float):
      yield f"{prefix}{key}", value


def check_ranges(config) -> None:
  """Raises ConfigError for the first float field that is not finite (inf, NaN), then the
  first field outside its fixed choices or its range."""
  for field, value in _float_fields(config):
    if not math.isfinite(value):
      raise errors.not_allowed(field, value, "a finite number")
  for field, allowed in CHOICES.items():
    value = get_field(config, field)
    if value not in allowed:
      raise errors.not_allowed(field, value, allowed)
  for field, test, allowed in _RANGES:
    value = get_field(config, field)
    try:
      ok = test(value)
    except TypeError:
      ok = False
    if not ok:
      raise errors.not_allowed(field, value, allowed)

