"""The configuration schema: every field a run reads, declared once (`FIELDS`) with its default,
what it allows and a line about it.

The ConfigDict a config file starts from (`default_config()`), the range checks
(`check_ranges`) and the configuration table of docs/reference.md (`reference_table`, which
tests/test_docs.py compares with the document) all come from the declarations. Config files
under `configs/` start from `default_config()` and change what their study needs (big_vision
style: `get_config(arg)`), and the command line overrides any field with `--config.a.b=value`.
Variants, sweep axes and study overrides go through `override()`, the same typed assignment the
command line uses. `ModelConfig` (normstudy.core.model) is derived from `default_config().model`,
so a new model field costs one declaration here.

Validation is split by what it needs to know: `check_ranges` (here) checks each field on its own;
normstudy.experiments.validation adds the registered names and the rules across fields.
"""

import contextlib
import math

import ml_collections

from normstudy import errors
from normstudy.core import technique_table
from normstudy.core.fields import Field
from normstudy.core.fields import get_field  # noqa: F401  (the one dotted getter, for callers)

_INT_1 = ("an integer >= 1", lambda v: v >= 1)
_POSITIVE = ("a number > 0", lambda v: v > 0)
_SEED = ("an integer in [0, 2^31)", lambda v: 0 <= v < 2**31)
# W&B refuses project names with these characters, or longer than 128 (docs.wandb.ai: project
# names); an offline run would keep its records under a name `wandb sync` then refuses.
_WANDB_PROJECT = ("\"\" (off) or a W&B project name of at most 128 characters, without "
                  "/ \\ # ? % :", lambda v: len(v) <= 128 and not set(v) & set("/\\#?%:"))
_INT_LIMIT = 2**31  # every integer field: a run holds them as int32


def _f(name, default, doc, allowed=None, accepts=None, **kw) -> Field:
  if isinstance(allowed, tuple) and len(allowed) == 2 and callable(allowed[1]):
    allowed, accepts = allowed
  return Field(name, default, doc, allowed, accepts, **kw)


_MODEL = (
    _f("model.num_layers", 4, "transformer blocks", _INT_1),
    _f("model.d_model", 128, "width of the residual stream", _INT_1),
    _f("model.num_heads", 4, "attention heads (they divide d_model)", _INT_1),
    _f("model.d_ff", 512, "hidden width of the MLP", _INT_1),
    _f("model.vocab_size", 256, "token ids are [0, vocab_size)", ("an integer >= 2",
                                                                 lambda v: v >= 2)),
    _f("model.max_len", 128, "tokens per row", ("an integer >= 2", lambda v: v >= 2)),
    _f("model.causal", True, "True: decoder-only LM (next token); False: bidirectional encoder "
       "trained by masked prediction with a learned mask embedding", "True or False"),
    _f("model.placement", "pre_ln", "where each block puts its norms (the norm-placement "
       "factory)", "a registered placement (normstudy.core.placements)"),
    _f("model.norm", "layernorm", "the norm, statistics in float32; dyt: Dynamic Tanh in "
       "place of every norm (Zhu et al. 2025)", "a registered norm: layernorm, rmsnorm, dyt"),
    _f("model.norm_eps", 1e-5, "the norms' epsilon", _POSITIVE),
    _f("model.dyt_alpha", 0.5, "norm=dyt: the initial alpha of gamma * tanh(alpha x) + beta "
       "(Zhu et al. 2025: 0.5)", _POSITIVE),
    _f("model.input_norm", False, "a norm on the embedding output before layer 0 (MERT's "
       "Post-LN encoder; wav2vec2 with layer_norm_first=False)", "True or False"),
    _f("model.activation", "gelu", "the MLP's activation; both GELUs run in float32",
       "a registered activation: gelu (exact erf), gelu_tanh, relu"),
    _f("model.init", "xavier", "projection init: Xavier-normal, or normal(0.02) (fairseq's "
       "init_bert_params); a placement's branch gain multiplies either", ("xavier", "bert")),
    _f("model.use_bias", False, "biases on q, k, v, out, fc1, fc2 and the position conv (zero "
       "at init, not decayed by adamw)", "True or False"),
    _f("model.attention", "softmax", "none: no attention sublayer (the blocks are MLPs; only a "
       "conv position embedding mixes tokens), the control of make attention",
       ("softmax", "none")),
    _f("model.attention_kernel", "xla", "the attention core: xla (the scores written out, a "
       "float32 softmax, as fairseq computes it) or cudnn (jax.nn.dot_product_attention's "
       "fused cuDNN kernel: a GPU, bfloat16, plain softmax attention; 4x less "
       "attention time at the 125M LM's shape on an H200, docs/throughput.md)",
       ("xla", "cudnn")),
    _f("model.attention_relax_form", "pb_relax", "the form of attention relax: CogView's (q "
       "divided before the product) or MERT's released code's (after it)",
       ("pb_relax", "after_product")),
    _f("model.mix_ln_fraction", 0.25, "mix_ln: the share of layers (rounded up) that are "
       "Post-LN", ("a number in (0, 1)", lambda v: 0 < v < 1)),
    _f("model.peri_ln_embedding_norm", True, "peri_ln: its norm on the embedding output",
       "True or False"),
    _f("model.base_width", 128, "parametrization mup, completep: the width at which they equal "
       "sp's learning rates and logits (m_N = d_model / base_width)", _INT_1),
    _f("model.base_depth", 4, "parametrization completep: the depth at which its branches are "
       "sp's (m_L = num_layers / base_depth)", _INT_1),
    _f("model.base_head_dim", 0, "parametrization mup, completep: the head width at which "
       "their 1/d_head attention scale equals sp's 1/sqrt(d_head); 0: each model's own (heads "
       "added with width, not widened)", ("an integer >= 0", lambda v: v >= 0)),
    _f("model.dtype", "float32", "compute dtype; parameters stay float32",
       ("float32", "bfloat16", "float16")),
    _f("model.scan_layers", None, "True: the layers under nn.scan (compile time flat in depth); "
       "False: unrolled; None: by the rule measured on XLA:CPU (normstudy.core.model.scans)",
       "None, True or False", kind=bool),
    _f("model.remat", "none", "rematerialisation of each block in the backward pass: none, "
       "block (keep its input), dots (keep the matmul outputs)", ("none", "block", "dots")),
    _f("model.dropout", 0.0, "on the embeddings and each sublayer's output",
       ("a number in [0, 1)", lambda v: 0 <= v < 1)),
    _f("model.tie_embeddings", True, "the output head shares the token embedding",
       "True or False"),
    _f("model.position_embedding", "sinusoidal", "positions: fixed sin/cos, learned, or "
       "wav2vec2/MERT's convolution (encoders only)", ("sinusoidal", "learned", "conv")),
    _f("model.conv_pos_width", 5, "conv positions: kernel width over the sequence", _INT_1),
    _f("model.conv_pos_groups", 4, "conv positions: channel groups (they divide d_model)",
       _INT_1),
)

_OPTIMIZER = (
    _f("optimizer.name", "adamw", "adamw (decay decoupled; norm gains and biases not decayed), "
       "adam (L2 added to the gradient), adam_fairseq (fairseq's Adam: every parameter decayed), "
       "adam_atan2 (atan2 in place of the division: no epsilon; Everett et al. 2024)",
       "a registered optimizer (normstudy.core.optimizer)"),
    _f("optimizer.learning_rate", 1e-3, "peak learning rate", _POSITIVE),
    _f("optimizer.b1", 0.9, "Adam's beta1", ("a number in [0, 1)", lambda v: 0 <= v < 1)),
    _f("optimizer.b2", 0.98, "Adam's beta2", ("a number in [0, 1)", lambda v: 0 <= v < 1)),
    _f("optimizer.eps", 1e-6, "Adam's epsilon (a per-run field; adam_atan2 has none)",
       _POSITIVE),
    _f("optimizer.weight_decay", 0.01, "weight decay", ("a number >= 0", lambda v: v >= 0)),
    _f("optimizer.warmup_steps", 100, "linear warm-up from 0 over these updates",
       ("an integer >= 0", lambda v: v >= 0)),
    _f("optimizer.schedule", "polynomial", "after the warm-up: constant, linear, cosine or "
       "polynomial (fairseq's polynomial_decay), ending at train.num_steps",
       "a registered schedule (normstudy.core.optimizer)"),
    _f("optimizer.power", 1.0, "polynomial: fairseq's power (1 = linear decay)", _POSITIVE),
    _f("optimizer.end_learning_rate", 0.0, "the rate the decay ends at",
       ("a number >= 0", lambda v: v >= 0)),
    _f("optimizer.update_clip", 0.0, "update clipping: each parameter's update (before the "
       "learning rate) divided by max(1, RMS / this) (Adafactor; Levanter's "
       "update_rms_clipping); one value per program", "0 (off) or a number > 0",
       lambda v: v >= 0),
    _f("optimizer.skip_spikes", 0.0, "skip-step on spikes: an update skipped (its optimizer "
       "state kept) when the loss or the gradient norm lies more than this many standard "
       "deviations from the mean of the previous skip_spikes_window steps (OLMo-core: 6); one "
       "value per program", "0 (off) or a number > 0", lambda v: v >= 0),
    _f("optimizer.skip_spikes_window", 128, "skip_spikes: the steps whose losses and gradient "
       "norms it compares against (OLMo-core: 128); it judges once max(20, window / 2) are "
       "recorded", ("an integer >= 19 (a shorter ring never holds 20)", lambda v: v >= 19)),
    _f("optimizer.clip_norm", 1.0, "optax.clip_by_global_norm on the unscaled gradient, once "
       "per step", ("None or 0 (off), or a number > 0", lambda v: v is None or v >= 0)),
    _f("optimizer.loss_scale.kind", "dynamic", "float16: dynamic (fairseq's scaler: the loss "
       "scaled, overflowing steps skipped) or none (gradients as they come; for "
       "parametrization umup, whose gradients are unit-scaled)", ("dynamic", "none")),
    _f("optimizer.loss_scale.initial_scale", 128.0, "fp16 dynamic loss scaling: the first scale "
       "(fairseq's default)", _POSITIVE),
    _f("optimizer.loss_scale.growth_interval", 2**14, "fp16: finite steps in a row that double "
       "the scale", _INT_1),
    _f("optimizer.loss_scale.min_scale", 1e-4, "fp16: the floor; an overflow there halts the "
       "run", _POSITIVE),
)

_DATA = (
    _f("data.name", "synthetic", "the dataset: shakespeare and kjv are real English text "
       "(normstudy.data.corpora)", "synthetic, text_files, shakespeare, kjv or a TFDS "
       "catalog dataset with a text feature (lm1b, c4/en, ...)"),
    _f("data.data_dir", None, "where datasets are generated or prepared; None: the TFDS "
       "default (~/tensorflow_datasets)", "None or a directory", kind=str),
    _f("data.files", "", "text_files: a glob of UTF-8 text files (byte-level tokens)",
       "a glob"),
    _f("data.validation_fraction", 0.05, "text_files: the tail of the corpus held out; "
       "shakespeare, kjv: every 1/fraction-th document (play, book) held out",
       ("a number in (0, 1)", lambda v: 0 < v < 1)),
    _f("data.seed", 0, "synthetic: the generator's seed", _SEED),
    _f("data.branching", 8, "synthetic: successors per token", _INT_1),
    _f("data.dialects", 1, "synthetic: 1 is the Markov chain; D > 1 the context language, a "
       "hidden topic per document", _INT_1),
    _f("data.dialect_weight", 0.5, "the context language: each next token from the topic with "
       "this probability", ("a number in (0, 1]", lambda v: 0 < v <= 1)),
    _f("data.train_tokens", 2**20, "tokens of the train split", _INT_1),
    _f("data.validation_tokens", 2**16, "tokens of the validation split", _INT_1),
    _f("data.text_feature", "text", "TFDS datasets: the text feature", "a feature's name"),
    _f("data.validation_split", "", "TFDS datasets: the held-out split (\"\": validation, else "
       "test)", "a split's name"),
    _f("data.tokenizer", "bytes", "TFDS datasets, shakespeare, kjv: bytes, train (a "
       "SentencePiece model trained from the train split on first use) or a SentencePiece "
       ".model's path",
       "bytes, train or a path"),
    _f("data.tokenizer_train_bytes", 2**24, "tokenizer=train: bytes of text it trains on",
       "an integer"),
    _f("data.mask_prob", 0.65, "encoders: the share of positions that start a masked span "
       "(HuBERT/MERT)", ("a number in [0, 1]", lambda v: 0 <= v <= 1)),
    _f("data.mask_length", 5, "encoders: positions a span masks", _INT_1),
)

_MESH = (
    _f("mesh.runs", 1, "devices axis of the K runs of one program, each on its own slice",
       "an integer >= 1, or -1 (the remaining devices)"),
    _f("mesh.data", -1, "replicas, each with a slice of the batch",
       "an integer >= 1, or -1 (the remaining devices)"),
    _f("mesh.fsdp", 1, "a slice of the batch and of every parameter and optimizer moment",
       "an integer >= 1, or -1 (the remaining devices)"),
    _f("mesh.tensor", 1, "attention heads and the MLP hidden dimension",
       "an integer >= 1, or -1 (the remaining devices)"),
)

_TRAIN = (
    _f("train.num_steps", 1000, "train steps (see count_skipped_steps)", _INT_1),
    _f("train.count_skipped_steps", True, "True: num_steps counts train steps, skipped fp16 "
       "overflow steps included; False: applied updates (fairseq's max_update)",
       "True or False"),
    _f("train.batch_size", 16, "rows per step", _INT_1),
    _f("train.seed", 0, "the run's seed: initial parameters, data order, masks, dropout", _SEED),
    _f("train.log_every", 1, "a record every this many steps (and on every step that matters)",
       _INT_1),
    _f("train.eval_every", 100, "an evaluation every this many steps and at the end",
       ("0 (never) or an integer >= 1", lambda v: v >= 0)),
    _f("train.eval_steps", 4, "batches of an evaluation", _INT_1),
    _f("train.eval_seed", 0, "the eval set's masks: validation rows 0 .. eval_steps * "
       "batch_size - 1 masked by this seed, the same for every run; -1: each run's own seed's",
       ("-1 (each run's own train.seed) or an integer >= 0", lambda v: v >= -1), before=-1),
    _f("train.checkpoint_every", 200, "a checkpoint every this many steps and at the end (-1: "
       "none at all, for runs whose states nobody reads: a killed one starts over)",
       ("-1 (never), 0 (only at the end) or an integer >= 1", lambda v: v >= -1)),
    _f("train.max_to_keep", 2, "checkpoints kept", _INT_1),
    _f("train.tensorboard", True, "TensorBoard event files beside metrics.jsonl (False spares "
       "the import of TensorFlow)", "True or False"),
    _f("train.wandb_project", "", "a Weights & Biases project to send every record to (\"\": "
       "off; the wandb extra)", _WANDB_PROJECT),
    _f("train.telemetry_every", 0, "per-layer telemetry every this many steps",
       ("0 (off) or an integer >= 1", lambda v: v >= 0)),
    _f("train.update_size_steps", 0, "the first this many steps record update_size: DeepNet's "
       "||f(x; theta_t+1) - f(x; theta_t)|| on the first eval batch, and accumulated_update, "
       "||f(x; theta_t) - f(x; theta_0)||",
       ("0 (off) or an integer >= 1", lambda v: v >= 0)),
    _f("train.steps_per_dispatch", 16, "plain train steps taken in one compiled loop between "
       "host round trips (records, evaluations, checkpoints and telemetry steps end a block; the "
       "trajectory is bit for bit the one of 1, one step per dispatch); a stop signal is acted "
       "on after the current block", _INT_1),
    _f("train.on_nonfinite", "halt", "float32/bfloat16 steps with a non-finite gradient: halt, "
       "or skip the update (float16 always skips through its loss scaler)", ("halt", "skip")),
    _f("train.max_consecutive_skips", 10, "on_nonfinite=skip: skipped updates in a row before "
       "the run halts", _INT_1),
)

FIELDS = (
    Field("label", "", "the legend label: a template ({auto}: described from the config; "
          "{section.field:format} fills in a field)", "a template"),
    *_MODEL, *_OPTIMIZER, *_DATA, *_MESH, *_TRAIN,
    *(t.declaration for t in technique_table.TECHNIQUES),
)
SECTIONS = ("model", "loss", "optimizer", "data", "mesh", "train")


def check_is_config(config, source: str) -> None:
  """ConfigError unless `config` (what `source`'s get_config() returned) is a ConfigDict with
  every section (rather than an AttributeError, or "error: 'train'", later)."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise errors.ConfigError(
        f"get_config() of {source} returned a {type(config).__name__}; it must return an "
        "ml_collections.ConfigDict built on normstudy.core.config.default_config()")
  missing = [name for name in SECTIONS if name not in config]
  if missing:
    raise errors.ConfigError(
        f"get_config() of {source} returned a config without the section(s) "
        f"{', '.join(missing)}; build it on normstudy.core.config.default_config()")


def default_config() -> ml_collections.ConfigDict:
  """Returns a config with every field normstudy reads (FIELDS), set to its default."""
  config = ml_collections.ConfigDict()
  for section in SECTIONS:
    config[section] = ml_collections.ConfigDict()
  for field in FIELDS:
    node = config
    for key in field.section.split(".") if field.section else ():
      if key not in node:
        node[key] = ml_collections.ConfigDict()
      node = node[key]
    node[field.key] = (ml_collections.config_dict.placeholder(field.kind)
                       if field.default is None else field.default)
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
    kind = _KIND_WORDS.get(type(node[name]))
    if kind is not None and "cannot be casted" in str(e):  # ml_collections' words (1.1)
      raise errors.ConfigError(f"config.{dotted}={value!r} is not allowed; allowed: {kind} "
                               f"(config.{dotted} is one)") from None
    raise errors.ConfigError(f"config.{dotted}={value!r}: {e}") from None


# A field's type in words, for a value of another type (not ml_collections' "... of original
# type <class 'str'> and cannot be casted to type <class 'float'>").
_KIND_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def apply_overrides(config, overrides: dict) -> None:
  for dotted, value in overrides.items():
    override(config, dotted, value)


def variant_config(variants: dict, base, variant: str, kind: str = "variant"):
  """The config of one row of a config file's table: `base()` (the config its rows share), then
  the row `variants[variant] = (label, {dotted.field: value})`: the label (a template,
  normstudy.core.labels) and the settings, applied as the command line applies overrides (what
  an Experiment's get_config is, normstudy.core.experiment). ValueError for a name the table
  lacks, naming the ones it has (`kind`: what a row is called there)."""
  if variant not in variants:
    raise ValueError(f"unknown {kind} {variant!r}; {kind}s: {', '.join(variants)}")
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


def check_known(config) -> None:
  """ConfigError for a field no declaration names (a config file's get_config may add one,
  which the model would otherwise fail on after compiling)."""
  declared = {field.name for field in FIELDS}

  def walk(node, prefix):
    for key in node.keys():
      name = f"{prefix}{key}"
      if isinstance(node[key], ml_collections.ConfigDict):
        walk(node[key], f"{name}.")
      elif name not in declared:
        raise errors.ConfigError(f"config.{name}={node[key]!r} is not a config field (its "
                                 "config file sets it); allowed: the fields of "
                                 "normstudy/core/config.py (docs/reference.md, Configuration)")
  walk(config, "")


def check_ranges(config) -> None:
  """Raises ConfigError for the first float field that is not finite (inf, NaN), then the
  first field (in FIELDS' order) outside what it allows."""
  for field, value in _float_fields(config):
    if not math.isfinite(value):
      raise errors.not_allowed(field, value, "a finite number")
  for field in FIELDS:
    value = get_field(config, field.name)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INT_LIMIT:
      # A run holds its steps, limits and seeds as 32-bit integers (normstudy.core.per_run).
      allowed = field.choices or field.allowed
      raise errors.not_allowed(field.name, value, (
          allowed if "2^31" in allowed else f"{allowed}, below 2^31")
          + " (a run counts in 32-bit integers)")
  for field in FIELDS:
    value = get_field(config, field.name)
    if not field.check(value):
      raise errors.not_allowed(field.name, value, field.choices or field.allowed)


def _default_text(value) -> str:
  if isinstance(value, str):
    return f"`{value!r}`" if value else '`""`'
  return f"`{value!r}`"


def reference_table(section: str) -> str:
  """The Markdown table of the fields of `section` (docs/reference.md, "Configuration"): field,
  default, what it allows, what it is."""
  rows = ["| field | default | allowed | what it is |", "| --- | --- | --- | --- |"]
  for field in FIELDS:
    if field.section.split(".")[0] == section or (not field.section and section == ""):
      allowed = field.allowed_text().replace("|", "\\|")
      rows.append(f"| `{field.name}` | {_default_text(field.default)} | {allowed} | "
                  f"{field.doc.replace('|', chr(92) + '|')} |")
  return "\n".join(rows)
