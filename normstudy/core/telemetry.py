"""Stability telemetry, in one place: the metric names, what the model sows, how a train step
collects it, how a record is flattened, and how analysis reads the keys back.

Two probes ride on the model's forward pass (`Probe`):
  stats   per-layer statistics, sown into the "intermediates" collection and collected by the
          telemetry train step (a second compiled step, so plain steps pay nothing);
  locate  a finiteness flag at every site of the forward pass, sown into "nonfinite"; the loop
          re-runs the forward of a step whose loss or gradient was non-finite with this probe
          to say where the failure started (`first_nonfinite`).

The metrics' names and record keys (`<name>/layer_<i>` per layer, the rest as their name) are
normstudy.records.keys', the sites' normstudy.records.schema's.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from normstudy.records import keys
from normstudy.records import schema

STATS = "intermediates"
LOCATE = "nonfinite"
QK_CLIP = "qk_clip"  # each head's largest logit, sown on every step when model.qk_clip > 0


@dataclasses.dataclass(frozen=True)
class Probe:
  stats: bool = False
  locate: bool = False


OFF = Probe()


def sow_stat(module, probe: Probe, name: str, value_fn) -> None:
  """Sows `value_fn()` (a float32 scalar) as telemetry statistic `name` when the probe asks."""
  if probe.stats:
    module.sow(STATS, name, jnp.asarray(value_fn(), jnp.float32))


def sow_site(module, probe: Probe, site: str, x) -> None:
  """Sows whether every value of `x` is finite at `site`, when locating."""
  if probe.locate:
    module.sow(LOCATE, site, jnp.all(jnp.isfinite(x)))


def absmax(x):
  return jnp.max(jnp.abs(x.astype(jnp.float32)))


def rms(x):
  return jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))


def row_entropy(probs):
  """Mean entropy of attention rows (probs float32, rows on the last axis)."""
  logs = jnp.log(jnp.where(probs > 0, probs, 1.0))
  return jnp.mean(-jnp.sum(probs * logs, axis=-1))


def _layer_values(cfg, tree, path) -> jax.Array:
  """[num_layers] values sown by the blocks under `path` (module names, then the value's name)."""

  def lookup(node):
    for key in path:
      node = node[key]
    return node[0]  # sow appends to a tuple

  if cfg.scanned:
    return lookup(tree["layers"])
  return jnp.stack([lookup(tree[f"layer_{i}"]) for i in range(cfg.num_layers)])


# Which module of a block sows each statistic.
_SOWN_BY = {"attn_logit_max": ("attention",), "attn_entropy": ("attention",),
            "mlp_preact_absmax": ("mlp",), "act_rms": (), "resid_absmax": (),
            "attn_norm_input_rms": (), "mlp_norm_input_rms": (),
            "attn_logit_max_per_head": ("attention",)}


def head_logit_max(cfg, sown) -> jax.Array:
  """[num_layers, num_heads]: each head's largest logit of the step, from the QK_CLIP
  collection."""
  return _layer_values(cfg, sown, ("attention", "head_logit_max"))


def _sown(cfg, tree, path: tuple) -> bool:
  """Whether the blocks sowed the value at `path` (module names, then the value's name): not
  attention's without an attention sublayer (model.attention=none), no norm's input in a
  placement without norms (ReZero)."""
  node = tree["layers"] if cfg.scanned else tree.get("layer_0", {})
  for key in path:
    if key not in node:
      return False
    node = node[key]
  return True


def per_layer_norms(cfg, tree) -> jax.Array:
  """[num_layers] L2 norms of each layer's part of a parameter-shaped tree."""
  if cfg.scanned:
    squares = [jnp.sum(jnp.square(x.astype(jnp.float32)), axis=tuple(range(1, x.ndim)))
               for x in jax.tree.leaves(tree["layers"])]
    return jnp.sqrt(sum(squares))
  return jnp.stack([optax.tree.norm(tree[f"layer_{i}"]) for i in range(cfg.num_layers)])


def collect(cfg, intermediates, logits, grads, updates, params) -> dict:
  """The telemetry of one step: per-layer arrays [num_layers] and global scalars."""
  out = {name: _layer_values(cfg, intermediates, _SOWN_BY[name] + (name,))
         if _sown(cfg, intermediates, _SOWN_BY[name] + (name,))
         else jnp.full(cfg.num_layers, jnp.nan)
         for name in keys.SOWN_LAYER_METRICS}
  for name, recorded in keys.HEAD_METRICS.items():  # [num_layers, num_heads]
    path = _SOWN_BY[recorded] + (recorded,)
    out[recorded] = (_layer_values(cfg, intermediates, path)
                     if _sown(cfg, intermediates, path)
                     else jnp.full((cfg.num_layers, cfg.num_heads), jnp.nan))
  out["grad_norm"] = per_layer_norms(cfg, grads)
  out["update_norm"] = per_layer_norms(cfg, updates)
  out["param_norm"] = per_layer_norms(cfg, params)
  out["output_logit_max"] = jnp.max(logits)
  out["log_z_mean"] = jnp.mean(jax.nn.logsumexp(logits, axis=-1))
  return out


def flatten(telemetry: dict) -> dict:
  """Per-layer arrays -> `<name>/layer_<i>` keys, per-head ones -> `<name>/layer_<i>/head_<j>`;
  global scalars as they are."""
  record = {}
  for name in keys.LAYER_METRICS:
    for i, value in enumerate(telemetry[name]):
      record[keys.layer_key(name, i)] = value
  for name, recorded in keys.HEAD_METRICS.items():
    for i, heads in enumerate(telemetry[recorded]):
      for j, value in enumerate(heads):
        record[keys.head_key(name, i, j)] = value
  for name in keys.GLOBAL_METRICS:
    record[name] = telemetry[name]
  return record


def site_flags(cfg, sown) -> dict:
  """The locate probe's flags as {"embedding": bool, "layers": {site: [num_layers]},
  "logits": bool} (device arrays)."""
  layers = {}
  for site in schema.LAYER_SITES:
    module = ("attention",) if site.startswith("attn") else ("mlp",) if site.startswith(
        "mlp") else ()
    # A block without attention (model.attention=none) has no attention sites: nothing there
    # can go non-finite.
    layers[site] = (_layer_values(cfg, sown, module + (site,))
                    if module != ("attention",) or cfg.attention != "none"
                    else jnp.ones(cfg.num_layers, bool))
  return {"embedding": sown["embedding"][0], "layers": layers, "logits": sown["logits"][0]}


def first_nonfinite(flags: dict) -> schema.Site:
  """Where a forward pass first went non-finite, from `site_flags` fetched to the host:
  Site(None, "embedding"), Site(3, "resid_attn"), Site(None, "logits"), or BACKWARD_ONLY."""
  if not bool(flags["embedding"]):
    return schema.Site(None, "embedding")
  num_layers = len(next(iter(flags["layers"].values())))
  for layer in range(num_layers):
    for site in schema.LAYER_SITES:
      if not bool(flags["layers"][site][layer]):
        return schema.Site(layer, site)
  if not bool(flags["logits"]):
    return schema.Site(None, "logits")
  return schema.BACKWARD_ONLY
