"""The transformer: embeddings, a stack of blocks from the norm-placement factory, an output head.

Notebook API:
  params = init_params(model_cfg, seed)            # nested dict of float32 arrays
  logits = forward(model_cfg, params, tokens)       # float32 [batch, length, vocab]

`model_cfg` is `config.model` (a ConfigDict), a plain dict with the same fields, or a `ModelConfig`.
Parameters carry logical axis names (for `normstudy.engine.sharding`) and their weight-decay role
(`decay_mask`); `init_params` returns them unboxed.

Dtypes (docs/reference.md, "Precision and fidelity"): parameters, embeddings and positions are
float32; the residual stream, the projections, attention products and the position conv run in the
compute dtype; norm statistics, GELU, the softmax, the relaxed score shift and the loss run in
float32, as fairseq runs them under --fp16.
"""

import dataclasses
import functools
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from normstudy.core import config as config_lib
from normstudy.core import layers
from normstudy.core import parametrizations
from normstudy.core import placements
from normstudy.core import telemetry


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _model_config_class():
  fields = [(name, type(value), dataclasses.field(default=value))
            for name, value in config_lib.default_config().model.items()]
  # Not a config field: how the program is compiled (normstudy.engine.platform), set by the steps.
  fields.append(("fusion_boundaries", bool, dataclasses.field(default=False)))

  @classmethod
  def create(cls, model_cfg: Any):
    if isinstance(model_cfg, cls):
      return model_cfg
    known = {f.name for f in dataclasses.fields(cls)} - {"fusion_boundaries"}
    values = dict(model_cfg.items()) if hasattr(model_cfg, "items") else dict(model_cfg)
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"unknown model field(s) {unknown}; known fields: {sorted(known)}")
    return cls(**values)

  namespace = {
      "__doc__": "Hashable copy of `config.model` (fields and defaults from "
                 "normstudy.core.config.default_config), for Flax modules and jit caches.",
      "create": create,
      "head_dim": property(lambda self: self.d_model // self.num_heads),
      "compute_dtype": property(lambda self: DTYPES[self.dtype]),
      "scanned": property(lambda self: scans(self)),
  }
  return dataclasses.make_dataclass("ModelConfig", fields, frozen=True, namespace=namespace)


ModelConfig = _model_config_class()

# model.remat -> what a block keeps for the backward pass (jax.checkpoint's policy): "block"
# keeps only the block's input (the checkpoint default) and recomputes everything else; "dots"
# keeps the outputs of matmuls without batch dimensions (the projections and the MLP, whose
# recomputation costs FLOPs) and recomputes the elementwise work between them (MaxText's
# "minimal", Levanter's default for large models).
REMAT_POLICIES = {"block": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}

# Stacks deeper than this are scanned by default.
UNROLL_MAX_LAYERS = 6


def scans(cfg) -> bool:
  """Whether the stack runs under nn.scan: `scan_layers` when set, else the rule measured on
  XLA:CPU (benchmarks/throughput.py --placements; docs/throughput.md). Unrolled, XLA fuses
  elementwise backward chains across layers and recomputes them in every consumer: where the
  residual stream passes through norms (Post-LN family) in float16/bfloat16 the cost grows with
  depth, and deep stacks suffer in float32 too; a loop cannot be fused across, so scanning
  bounds the chains to one layer. Shallow identity-residual stacks run faster unrolled."""
  if cfg.scan_layers is not None:
    return bool(cfg.scan_layers)
  placement = placements.get(cfg.placement)
  sixteen_bit = cfg.dtype in ("float16", "bfloat16")
  return cfg.num_layers > UNROLL_MAX_LAYERS or (sixteen_bit and not placement.identity_residual)


def _rematerialised(cfg, block):
  """`block` under cfg.remat's policy (REMAT_POLICIES), or as it is for "none". Unrolled, the
  layer index is a Python int and stays static; scanned, it is traced (nn.scan's xs)."""
  if cfg.remat == "none":
    return block
  return nn.remat(block, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scanned,
                  static_argnums=() if cfg.scanned else (2,))


class Transformer(nn.Module):
  cfg: Any
  deterministic: bool = True
  probe: telemetry.Probe = telemetry.OFF

  @nn.compact
  def __call__(self, tokens, mask=None):
    """tokens: int32 [batch, length]; mask: optional bool [batch, length] of positions whose input
    is replaced by the learned mask embedding (encoders trained by masked prediction)."""
    cfg = self.cfg
    dtype = cfg.compute_dtype
    placement = placements.get(cfg.placement)
    embedding = layers.param(self, "embedding", nn.initializers.normal(layers.BERT_STD),
                             (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), role="embedding",
                             fan_in=cfg.vocab_size)
    x = jnp.take(embedding, tokens, axis=0)
    if cfg.emb_grad_shrink < 1:
      # GLM-130B's embedding gradient shrink (Zeng et al. 2022, section 3.3): the forward value
      # is unchanged, the gradient into the embedding table scaled by alpha.
      a = cfg.emb_grad_shrink
      x = a * x + (1 - a) * jax.lax.stop_gradient(x)
    if not cfg.causal:
      mask_embedding = layers.param(self, "mask_embedding",
                                    nn.initializers.normal(layers.BERT_STD), (cfg.d_model,),
                                    ("embed",), role="embedding")
      if mask is not None:
        # Before positions: a masked position keeps its position (wav2vec2/HuBERT mask the
        # features, then add the positions).
        x = jnp.where(mask[..., None], mask_embedding, x)
    length = tokens.shape[1]
    if cfg.position_embedding == "learned":
      x = x + layers.param(self, "pos_embedding", nn.initializers.normal(layers.BERT_STD),
                           (cfg.max_len, cfg.d_model), (None, "embed"), role="embedding",
                           fan_in=cfg.max_len)[:length]
    elif cfg.position_embedding == "sinusoidal":
      x = x + layers.sinusoidal_positions(cfg.max_len, cfg.d_model)[:length]
    # A boundary on the float32 sum: without it XLA:CPU fuses the position embedding's gradient
    # (a sum over the batch) with layer 0's backward pass and computes that a second time there
    # (3.3 of 110 ms of operations per step at benchmarks/throughput.py's S). Before the cast:
    # after it, a bfloat16 run's gradient was rounded before that sum and its bits changed
    # (benchmarks/trees.py bits).
    x = layers.boundary(cfg, x).astype(dtype)
    if cfg.position_embedding == "conv":
      x = x + layers.ConvPositions(cfg, name="pos_conv")(x)
    if (placement.embedding_norm and cfg.peri_ln_embedding_norm) or cfg.input_norm:
      x = layers.make_norm(cfg, "embedding_norm")(x)
    if placement.unit_sphere:  # nGPT: the hidden state starts on the unit sphere
      x = placements.unit(x)
    telemetry.sow_site(self, self.probe, "embedding", x)
    x = nn.Dropout(cfg.dropout)(x, deterministic=self.deterministic)

    if cfg.scanned:
      collections = {"params": 0, telemetry.STATS: 0, telemetry.LOCATE: 0, telemetry.QK_CLIP: 0}
      stack = nn.scan(
          _rematerialised(cfg, layers.ScanBlock), variable_axes=collections,
          split_rngs={"params": True, "dropout": True}, length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"},
      )(cfg, self.deterministic, self.probe, name="layers")
      x, _ = stack(x, jnp.arange(cfg.num_layers, dtype=jnp.int32))
    else:
      block = _rematerialised(cfg, layers.Block)
      for i in range(cfg.num_layers):
        x = block(cfg, self.deterministic, self.probe, name=f"layer_{i}")(x, i)

    if placement.final_norm:
      x = layers.make_norm(cfg, "final_norm")(x)
    logits = _readout(self, cfg, x, embedding, placement)
    telemetry.sow_site(self, self.probe, "logits", logits)
    return layers.softcap(logits, cfg.output_softcap)


def _readout(module, cfg, x, embedding, placement):
  """The float32 output logits of the last hidden state `x`: the head (the embedding's transpose
  when tied, times the readout's multiplier: muP's MuSharedReadout), nGPT's per-entry scale, a
  fusion boundary, the logits' layout. Parameters are `module`'s (the Transformer's)."""
  if cfg.tie_embeddings:
    head = embedding.T  # times the readout's multiplier (muP's MuSharedReadout)
    if (multiplier := parametrizations.forward_multiplier(cfg, "readout", cfg.d_model)) != 1.0:
      head = head * multiplier
  else:
    head = layers.param(module, "head", layers.projection_init(cfg),
                        (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), role="readout",
                        fan_in=cfg.d_model)
  logits = jnp.einsum("bld,dv->blv", x, head.astype(cfg.compute_dtype)).astype(jnp.float32)
  if placement.unit_sphere:
    # nGPT's s_z (Loshchilov et al. 2024, section 2.2.1): h and the head's columns are unit
    # vectors, so each logit is a cosine in [-1, 1], scaled per vocabulary entry.
    stored = layers.param(module, "logit_scale", nn.initializers.constant(
        1.0 / math.sqrt(cfg.d_model)), (cfg.vocab_size,), ("vocab",), decay=False)
    logits = logits * placements.ngpt_scaled(stored, placements.NGPT_LOGIT_SCALE_INIT,
                                             cfg.d_model)
  logits = layers.boundary(cfg, logits)
  logits = layers.constrain(logits, ("batch", "length", "act_vocab"))
  return logits


def _flax_init(cfg):
  def init(key):
    tokens = jnp.zeros((1, cfg.max_len), jnp.int32)
    mask = None if cfg.causal else jnp.zeros((1, cfg.max_len), bool)
    return Transformer(cfg).init(key, tokens, mask)["params"]
  return init


def boxed_init(cfg):
  """A function key -> boxed params (logical axis names and decay roles), for sharded init.
  A unit-sphere placement's (nGPT's) matrices start on the sphere (onto_sphere)."""
  init = _flax_init(cfg)
  if not placements.get(cfg.placement).unit_sphere:
    return init

  def on_sphere(key):
    return jax.tree.map(lambda box: box.replace_boxed(_onto_sphere(box.value, _embed_axis(box))),
                        init(key), is_leaf=_is_box)
  return on_sphere


_NO_AXIS = -1  # a leaf that onto_sphere leaves alone (None would be an empty subtree)


def _embed_axis(box) -> int:
  """The axis of a matrix that its logical name calls "embed" (d_model), or _NO_AXIS for a
  vector (gains, biases, nGPT's own scales; a scanned stack's layer axis does not count) or a
  parameter without one."""
  names = tuple(box.names)
  own = [n for n in names if n != "layers"]  # nn.scan's axis (model.Transformer)
  return names.index("embed") if len(own) >= 2 and "embed" in own else _NO_AXIS


def _onto_sphere(value, axis: int):
  return value if axis == _NO_AXIS else placements.unit(value, axis)


@functools.lru_cache(maxsize=32)
def _embed_axes(cfg):
  boxed = jax.eval_shape(_flax_init(cfg), jax.random.key(0))
  return jax.tree.map(_embed_axis, boxed, is_leaf=_is_box)


def onto_sphere(model_cfg: Any, params):
  """nGPT's renormalisation (Loshchilov et al. 2024, section 2.6: after each update "all
  matrices are normalized along their embedding dimension"): every matrix parameter divided by
  its L2 norm along its "embed" axis, so each embedding row, each column of W_q, W_k, W_v and
  fc1 (over d_model in), each row of W_o and fc2 (over d_model out), each head column (and the
  position conv's kernel over its output channels) is a unit vector. Vectors (biases, nGPT's
  alpha and s_z) are left as they are."""
  cfg = ModelConfig.create(model_cfg)
  return jax.tree.map(_onto_sphere, params, _embed_axes(cfg))


@functools.lru_cache(maxsize=32)
def _jitted_init(cfg):
  # One compiled program per model config: eager Flax init dispatches (and compiles) every
  # primitive on its own, which costs more than compiling the whole init even for a tiny model.
  return jax.jit(lambda key: nn.unbox(boxed_init(cfg)(key)))


def init_params(model_cfg: Any, seed: int = 0) -> dict:
  """Initial parameters as a nested dict of float32 arrays (boxes removed)."""
  cfg = ModelConfig.create(model_cfg)
  return _jitted_init(cfg)(jax.random.key(seed))


def _is_box(x):
  return isinstance(x, layers.RoleBox)


def decay_mask(model_cfg: Any) -> dict:
  """Parameter-shaped tree of bools: True where weight decay applies, as each parameter declared
  where it was created (projections and embeddings yes; norm gains and biases no)."""
  return jax.tree.map(lambda decays: decays, _decay_mask(ModelConfig.create(model_cfg)))


@functools.lru_cache(maxsize=32)
def _decay_mask(cfg):
  # Traced once per model config: every step a program compiles asks for it.
  boxed = jax.eval_shape(boxed_init(cfg), jax.random.key(0))
  return jax.tree.map(lambda box: box.decay, boxed, is_leaf=_is_box)


def optimizer_multipliers(model_cfg: Any) -> tuple:
  """(learning-rate factors, epsilon factors): parameter-shaped trees of floats from the
  parametrization (normstudy.core.parametrizations: each parameter's role, fan-in and whether it
  is inside a block), or (None, None) when every factor is 1 (sp: the optimizer as it was)."""
  cfg = ModelConfig.create(model_cfg)
  lrs, epss = _multipliers(cfg)
  flat = [f for tree in (lrs, epss) for f in jax.tree.leaves(tree)]
  if all(f == 1.0 for f in flat):
    return None, None
  return (jax.tree.map(lambda f: f, lrs), jax.tree.map(lambda f: f, epss))


def parameter_rules(model_cfg: Any) -> list:
  """Every parameter's rules under the model's parametrization, as a `mup` user would compare
  them (normstudy.coordcheck --print_rules): [{path, shape, role, fan_in, in_block, init_rms
  (its root mean square as initialised with key 0), forward (its forward multiplier), lr, eps (its
  learning-rate and epsilon factors)}], in the parameter tree's order."""
  cfg = ModelConfig.create(model_cfg)
  boxed = jax.eval_shape(boxed_init(cfg), jax.random.key(0))
  values = init_params(model_cfg, 0)
  lrs, epss = _multipliers(cfg)
  rows = []
  flat = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=_is_box)[0]
  for (path, box), value, lr, eps in zip(flat, jax.tree.leaves(values), jax.tree.leaves(lrs),
                                         jax.tree.leaves(epss)):
    rows.append({"path": "/".join(str(getattr(k, "key", k)) for k in path),
                 "shape": tuple(box.value.shape), "role": box.role, "fan_in": box.fan_in,
                 "in_block": _in_block(path),
                 "init_rms": float(jnp.sqrt(jnp.mean(jnp.square(value)))),
                 "forward": parametrizations.forward_multiplier(cfg, box.role, box.fan_in),
                 "lr": float(lr), "eps": float(eps)})
  return rows


def _in_block(path) -> bool:
  names = [getattr(k, "key", None) for k in path]
  return any(n == "layers" or (isinstance(n, str) and n.startswith("layer_")) for n in names)


@functools.lru_cache(maxsize=32)
def _multipliers(cfg):
  boxed = jax.eval_shape(boxed_init(cfg), jax.random.key(0))

  def factor(of):
    return jax.tree_util.tree_map_with_path(
        lambda path, box: of(box, _in_block(path)), boxed, is_leaf=_is_box)
  return (factor(lambda box, inside: parametrizations.lr_multiplier(cfg, box.role, box.fan_in,
                                                                   inside)),
          factor(lambda box, inside: parametrizations.eps_multiplier(cfg, box.role)))


@functools.lru_cache(maxsize=32)
def _jitted_forward(cfg):
  return jax.jit(lambda params, tokens, mask: Transformer(cfg).apply(
      {"params": params}, tokens, mask))


def forward(model_cfg: Any, params: Mapping, tokens, mask=None) -> jax.Array:
  """float32 logits [batch, length, vocab] for int32 tokens [batch, length] (no dropout)."""
  cfg = ModelConfig.create(model_cfg)
  tokens = jnp.asarray(tokens, jnp.int32)
  if mask is not None:
    mask = jnp.asarray(mask, bool)
  return _jitted_forward(cfg)(params, tokens, mask)
