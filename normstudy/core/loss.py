"""The training objective: cross entropy on the predicted tokens, plus optional auxiliary terms.

What is predicted depends on the model: a causal LM predicts the next token at every position; an
encoder trained by masked prediction predicts the tokens at masked positions. Auxiliary terms
(e.g. PaLM's z-loss) are added here and logged separately, so block designs never see them.
"""

import jax
import jax.numpy as jnp
import optax

from normstudy.records import keys


def targets(cfg, logits, batch):
  """(logits, target ids, float32 weights) of the predicted positions."""
  tokens = batch["tokens"]
  if cfg.causal:
    return logits[:, :-1], tokens[:, 1:], jnp.ones(tokens[:, 1:].shape, jnp.float32)
  return logits, tokens, batch["mask"].astype(jnp.float32)


def cross_entropy(cfg, logits, batch) -> tuple[jax.Array, jax.Array]:
  """(mean loss per predicted token, number of predicted tokens)."""
  logits, labels, weights = targets(cfg, logits, batch)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  count = jnp.sum(weights)
  return jnp.sum(losses * weights) / jnp.maximum(count, 1.0), count


def z_loss(cfg, logits, batch) -> jax.Array:
  """PaLM's auxiliary z-loss without its coefficient: the mean over predicted tokens of
  (log Z)^2, Z = sum_v exp(logit_v) (Chowdhery et al. 2022, "PaLM", section 5). It pulls
  log Z towards 0, so the output logits cannot drift."""
  logits, _, weights = targets(cfg, logits, batch)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  return jnp.sum(jnp.square(log_z) * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def objective(cfg, loss_cfg, logits, batch) -> tuple[jax.Array, dict]:
  """(the loss to differentiate, {"loss": cross entropy, <aux term>: value, ...}).

  `loss_cfg` is `config.loss`. "loss" stays the cross entropy, so
  runs with and without auxiliary terms compare; each term is logged under its own key
  ("z_loss": the coefficient times the mean (log Z)^2, what it adds to the loss)."""
  ce, _ = cross_entropy(cfg, logits, batch)
  total, terms = ce, {keys.LOSS: ce}
  coefficient = loss_cfg.z_loss
  if coefficient > 0:
    terms[keys.Z_LOSS] = coefficient * z_loss(cfg, logits, batch)
    total = total + terms[keys.Z_LOSS]
  return total, terms
