"""Every check of a config that must pass before anything is created or written.

Three kinds, one error path each (all raise errors.ConfigError with one line):
  ranges   each field on its own (normstudy.core.config.check_ranges);
  names    fields whose values are registered names: placements, norms, activations, optimizers,
           datasets (each registry's own `get`, so the allowed list is the registry's);
  rules    combinations across fields (RULES below, then each technique's conflicts:
           normstudy.core.technique_table).
The mesh's divisibility is checked by normstudy.engine.sharding.check_divisible, which knows the
mesh.
"""

from normstudy import errors
from normstudy.core import config as config_lib
from normstudy.core import labels
from normstudy.core import layers
from normstudy.core import optimizer as optimizer_lib
from normstudy.core import parametrizations
from normstudy.core import placements
from normstudy.core import technique_table
from normstudy.core.fields import get_field
from normstudy.data import sources as data_lib

REGISTRIES = (placements.REGISTRY, layers.NORMS, layers.ACTIVATIONS, optimizer_lib.OPTIMIZERS,
              optimizer_lib.SCHEDULES)


def _rule(test, message):
  return test, message


# (holds(config) -> bool, message(config) -> str): each must hold.
RULES = (
    _rule(lambda c: c.model.d_model % c.model.num_heads == 0,
          lambda c: f"config.model.num_heads={c.model.num_heads} does not divide "
                    f"config.model.d_model={c.model.d_model}"),
    _rule(lambda c: not (c.model.position_embedding == "conv" and c.model.causal),
          lambda c: "config.model.position_embedding='conv' sees both sides of a position; "
                    "allowed only with config.model.causal=False"),
    _rule(lambda c: c.model.position_embedding != "conv"
          or c.model.d_model % c.model.conv_pos_groups == 0,
          lambda c: f"config.model.conv_pos_groups={c.model.conv_pos_groups} does not divide "
                    f"config.model.d_model={c.model.d_model}"),
    _rule(lambda c: c.data.mask_length <= c.model.max_len,
          lambda c: f"config.data.mask_length={c.data.mask_length} is longer than "
                    f"config.model.max_len={c.model.max_len}"),
    _rule(lambda c: c.data.name != "text_files" or bool(c.data.files),
          lambda c: "config.data.files is empty; config.data.name='text_files' needs a glob of "
                    "UTF-8 text files"),
    _rule(lambda c: c.data.name == "synthetic" or c.data.tokenizer != "bytes"
          or c.model.vocab_size >= 256,
          lambda c: f"config.model.vocab_size={c.model.vocab_size} is too small for byte-level "
                    "tokens (config.data.tokenizer='bytes' or text_files); allowed: >= 256"),
    *(_rule(lambda c, split=split: c.data.name != "synthetic"
            or data_lib.synthetic_tokens(c.data[f"{split}_tokens"]) >= c.model.max_len,
            lambda c, split=split: (
                f"config.model.max_len={c.model.max_len} is longer than the synthetic {split} "
                f"split holds (config.data.{split}_tokens={c.data[f'{split}_tokens']}: "
                f"{data_lib.synthetic_tokens(c.data[f'{split}_tokens'])} tokens); allowed: "
                f"max_len <= {data_lib.synthetic_tokens(c.data[f'{split}_tokens'])}, or more "
                f"{split}_tokens"))
      for split in ("train", "validation")),
    _rule(lambda c: c.data.name != "text_files" or c.data.tokenizer == "bytes",
          lambda c: f"config.data.tokenizer={c.data.tokenizer!r} applies to TFDS catalog "
                    "datasets; text_files are read as byte-level tokens; allowed: 'bytes'"),
    # The fused kernel computes softmax(q k^T / sqrt(d)) v and nothing else: whatever changes
    # the scores needs them written out.
    *(_rule(lambda c, field=field, off=off: c.model.attention_kernel != "cudnn"
            or get_field(c, field) == off,
            lambda c, field=field, off=off: (
                f"config.{field}={get_field(c, field)!r} changes the attention scores, which "
                "config.model.attention_kernel='cudnn' never writes out; allowed with cudnn: "
                f"{off!r}, or attention_kernel='xla'"))
      for field, off in (("model.attention_relax", 0.0), ("model.attn_softcap", 0.0),
                         ("model.qk_clip", 0.0), ("model.attention_scores_dtype", "compute"))),
    _rule(lambda c: c.model.attention_kernel != "cudnn" or c.model.attention != "none",
          lambda c: "config.model.attention_kernel='cudnn' computes attention; "
                    "config.model.attention='none' has none; allowed: attention_kernel='xla'"),
    # float16 is refused on purpose: the kernel accumulates q k^T in float32, so the float16
    # score overflow the study measures (and attention relax guards against) could not happen.
    _rule(lambda c: c.model.attention_kernel != "cudnn" or c.model.dtype == "bfloat16",
          lambda c: f"config.model.dtype={c.model.dtype!r}: config.model.attention_kernel="
                    "'cudnn' runs in bfloat16 only (in float16 its float32 scores could not "
                    "overflow as float16 attention does); allowed: 'bfloat16', or "
                    "attention_kernel='xla'"),
    # Without a scaler, float16 gradients under- and overflow unless the model keeps them at
    # unit scale (u-muP's backward scales).
    _rule(lambda c: c.optimizer.loss_scale.kind == "dynamic" or c.model.dtype != "float16"
          or parametrizations.get(c.model.parametrization).unit_scaled,
          lambda c: "config.optimizer.loss_scale.kind='none' trains float16 without a loss "
                    "scaler, whose gradients would underflow or overflow under config.model."
                    f"parametrization={c.model.parametrization!r}; allowed: 'dynamic', or "
                    "parametrization " + " or ".join(
                        repr(p.name) for p in parametrizations.REGISTRY.registered()
                        if p.unit_scaled) + " (unit-scaled gradients)"),
    # A placement without norm modules (ReZero; nGPT normalises onto the unit sphere): a norm
    # choice or an input norm would be silently meaningless.
    _rule(lambda c: placements.get(c.model.placement).has_norms or c.model.norm == "layernorm",
          lambda c: f"config.model.norm={c.model.norm!r} chooses the norms; config.model."
                    f"placement={c.model.placement!r} has none; allowed: 'layernorm' (the "
                    "default, unused)"),
    _rule(lambda c: not placements.get(c.model.placement).unit_sphere or not c.model.input_norm,
          lambda c: "config.model.input_norm=True adds a LayerNorm on the embedding; config."
                    f"model.placement={c.model.placement!r} puts the embedding on the unit "
                    "sphere instead; allowed: False"),
    _rule(lambda c: c.data.name != "synthetic" or c.data.branching <= c.model.vocab_size,
          lambda c: f"config.data.branching={c.data.branching} exceeds "
                    f"config.model.vocab_size={c.model.vocab_size}"),
    # Each dialect's topic is a disjoint set of the rarer three quarters of the vocabulary
    # (normstudy.data.synthetic.topic_sets): at least one token each.
    _rule(lambda c: c.data.name != "synthetic"
          or c.data.dialects <= c.model.vocab_size - c.model.vocab_size // 4,
          lambda c: f"config.data.dialects={c.data.dialects} is more topics than "
                    f"config.model.vocab_size={c.model.vocab_size} has tokens for; allowed: at "
                    f"most {c.model.vocab_size - c.model.vocab_size // 4} (three quarters of "
                    "the vocabulary)"),
)


def validate(config) -> None:
  """Raises ConfigError naming the first bad field (or combination), its value and what is
  allowed."""
  config_lib.check_known(config)
  config_lib.check_ranges(config)
  for registry in REGISTRIES:
    registry.get(get_field(config, registry.field))
  data_lib.check_name(config.data.name)
  for holds, message in RULES:
    if not holds(config):
      raise errors.ConfigError(message(config))
  for message in technique_table.conflicts(config):
    raise errors.ConfigError(message)
  labels.check(config)
