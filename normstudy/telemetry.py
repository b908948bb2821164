"""Stability telemetry, in one place: the metric names, what the model sows, how a train step
collects it, how a record is flattened, and how analysis reads the keys back.

Two probes ride on the model's forward pass (`Probe`):
  stats   per-layer statistics, sown into the "intermediates" collection and collected by the
          telemetry train step (a second compiled step, so plain steps pay nothing);
  locate  a finiteness flag at every site of the forward pass, sown into "nonfinite"; the loop
          re-runs the forward of a step whose loss or gradient was non-finite with this probe
          to say where the failure started (`first_nonfinite`).

Per-layer metrics are recorded as `<name>/layer_<i>`; the rest as their name.
"""

from __future__ import annotations  # annotations name jax types the analysis need not import

import dataclasses
import re

from normstudy import life

try:
  import jax
  import jax.numpy as jnp
  import optax
except ImportError:  # the analysis reads record keys where the training stack is not installed
  jax = jnp = optax = None

STATS = "intermediates"
LOCATE = "nonfinite"

# Sown by the model, one value per layer.
SOWN_LAYER_METRICS = (
    "attn_logit_max",  # largest pre-softmax attention score as the softmax sees it
    "attn_entropy",  # mean entropy (nats) of the attention rows
    "act_rms",  # RMS of the residual stream after the block
    "resid_absmax",  # max |x| of the residual stream after the block
    "mlp_preact_absmax",  # max |input of the MLP activation|
)
# Computed by the step from gradients, updates and parameters, one value per layer.
STEP_LAYER_METRICS = ("grad_norm", "update_norm", "param_norm")
LAYER_METRICS = SOWN_LAYER_METRICS + STEP_LAYER_METRICS
GLOBAL_METRICS = ("output_logit_max", "log_z_mean")

# Where a forward pass can first go non-finite inside a layer, in the order it computes them.
LAYER_SITES = life.LAYER_SITES
BACKWARD_ONLY = life.BACKWARD_ONLY


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
            "mlp_preact_absmax": ("mlp",), "act_rms": (), "resid_absmax": ()}


def _sown(cfg, module: tuple) -> bool:
  """Whether the blocks have the module that sows under `module` (no attention sublayer with
  model.attention=none)."""
  return module != ("attention",) or cfg.attention != "none"


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
         if _sown(cfg, _SOWN_BY[name]) else jnp.full(cfg.num_layers, jnp.nan)
         for name in SOWN_LAYER_METRICS}
  out["grad_norm"] = per_layer_norms(cfg, grads)
  out["update_norm"] = per_layer_norms(cfg, updates)
  out["param_norm"] = per_layer_norms(cfg, params)
  out["output_logit_max"] = jnp.max(logits)
  out["log_z_mean"] = jnp.mean(jax.nn.logsumexp(logits, axis=-1))
  return out


def layer_key(name: str, layer: int) -> str:
  return f"{name}/layer_{layer}"


_LAYER_KEY = re.compile(r"^(?P<name>[a-z_]+)/layer_(?P<layer>\d+)$")


def parse_layer_key(key: str):
  """(name, layer) for a `<name>/layer_<i>` record key, else None."""
  match = _LAYER_KEY.match(key)
  return (match["name"], int(match["layer"])) if match else None


def flatten(telemetry: dict) -> dict:
  """Per-layer arrays -> `<name>/layer_<i>` keys; global scalars as they are."""
  record = {}
  for name in LAYER_METRICS:
    for i, value in enumerate(telemetry[name]):
      record[layer_key(name, i)] = value
  for name in GLOBAL_METRICS:
    record[name] = telemetry[name]
  return record


def site_flags(cfg, sown) -> dict:
  """The locate probe's flags as {"embedding": bool, "layers": {site: [num_layers]},
  "logits": bool} (device arrays)."""
  layers = {}
  for site in LAYER_SITES:
    module = ("attention",) if site.startswith("attn") else ("mlp",) if site.startswith(
        "mlp") else ()
    # A block without attention (model.attention=none) has no attention sites: nothing there
    # can go non-finite.
    layers[site] = (_layer_values(cfg, sown, module + (site,)) if _sown(cfg, module) else
                    jnp.ones(cfg.num_layers, bool))
  return {"embedding": sown["embedding"][0], "layers": layers, "logits": sown["logits"][0]}


def first_nonfinite(flags: dict) -> life.Site:
  """Where a forward pass first went non-finite, from `site_flags` fetched to the host:
  Site(None, "embedding"), Site(3, "resid_attn"), Site(None, "logits"), or BACKWARD_ONLY."""
  if not bool(flags["embedding"]):
    return life.Site(None, "embedding")
  num_layers = len(next(iter(flags["layers"].values())))
  for layer in range(num_layers):
    for site in LAYER_SITES:
      if not bool(flags["layers"][site][layer]):
        return life.Site(layer, site)
  if not bool(flags["logits"]):
    return life.Site(None, "logits")
  return BACKWARD_ONLY
