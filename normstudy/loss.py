"""The training objective: cross entropy on the predicted tokens, plus optional auxiliary terms.

What is predicted depends on the model: a causal LM predicts the next token at every position; an
encoder trained by masked prediction predicts the tokens at masked positions. Auxiliary terms
(e.g. PaLM's z-loss) are added here and logged separately, so block designs never see them.
"""

import jax
import jax.numpy as jnp
import optax


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


def objective(cfg, loss_cfg, logits, batch) -> tuple[jax.Array, dict]:
  """(the loss to differentiate, {"loss": cross entropy, <aux term>: value, ...}).

  `loss_cfg` is `config.loss` (None: cross entropy only)."""
  del loss_cfg
  ce, _ = cross_entropy(cfg, logits, batch)
  return ce, {"loss": ce}
