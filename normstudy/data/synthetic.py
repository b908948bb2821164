"""The embedded default dataset: a seeded sparse Markov chain over a Zipf-like vocabulary.

Why a Markov chain: its entropy rate, the lowest per-token loss any next-token model can reach, is
known exactly, so every loss curve can be drawn against a true floor.

The language, for vocabulary size V, branching k and seed s:
  zipf_j  = (j + 1)^-1.1 / sum                         token frequencies of a Zipf-like vocabulary
  row i   : k distinct successors drawn with probabilities zipf, Dirichlet(1) weights on them
  P       = (1 - eps) * sparse + eps * zipf             eps = 0.05 keeps the chain irreducible and
                                                        aperiodic, so it has one stationary law
  pi      = the stationary distribution (pi P = pi, by power iteration to 1e-12)
  H       = -sum_i pi_i sum_j P_ij log P_ij              entropy rate in nats per token
  H(pi)   = -sum_i pi_i log pi_i                        unigram entropy: the loss of a model that
                                                        uses no context (the early plateau)
For masked prediction the floor is lower than H: a masked token sees both neighbours.
`masked_loss_floor` estimates the Bayes-optimal loss under the run's masking by forward-backward
(the posterior of each masked token given every visible one), by Monte Carlo over rows and masks.
Documents are `DOC_LENGTH` tokens long and start from pi, so the whole corpus is stationary; only
the first token of each document (1 in DOC_LENGTH) is unpredictable from its predecessor.

The chain needs no attention: the current token is sufficient for the next, the nearest visible
neighbours for a masked one. The context language (`dialects` D > 1, configs/context.py) hides a
per-document state, its topic, that only the row as a whole reveals:
  T_z     uniform over topic z's tokens: D disjoint sets of rare tokens (`topic_sets`)
  P_z     = (1 - w) P + w 1 T_z    dialect z: each next token is the chain's with probability
                                   1 - w, else a token of the topic (w: dialect_weight)
  z       ~ uniform, once per document; the document is a stationary chain of P_z
A few neighbouring tokens rarely show which topic a row is in, a row of 64 tokens nearly
always does, so a model that mixes no information across the row stays above the floor. The
floors condition on the row alone (a row is all a model sees): for row x and dialect z,
  p(z | visible) ∝ p_z(visible tokens)              the chain likelihood, forward pass
  p(x_t | x_<t)  = sum_z p(z | x_<t) P_z(x_{t-1}, x_t)             causal (`causal_loss_floor`)
  p(x_t | visible) = sum_z p(z | visible) p_z(x_t | visible)      masked (`masked_loss_floor`)
exact per row, averaged over rows by Monte Carlo with a standard error. D = 1 is the chain.
"""

import numpy as np
import tensorflow_datasets as tfds

DOC_LENGTH = 4096
SMOOTHING = 0.05
ZIPF_EXPONENT = 1.1


def zipf_frequencies(vocab_size: int) -> np.ndarray:
  weights = (np.arange(vocab_size) + 1.0) ** -ZIPF_EXPONENT
  return weights / weights.sum()


def transition_matrix(vocab_size: int, branching: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  zipf = zipf_frequencies(vocab_size)
  sparse = np.zeros((vocab_size, vocab_size))
  for row in sparse:
    successors = rng.choice(vocab_size, size=min(branching, vocab_size), replace=False, p=zipf)
    row[successors] = rng.dirichlet(np.ones(len(successors)))
  return (1 - SMOOTHING) * sparse + SMOOTHING * zipf[None, :]


def stationary_distribution(transitions: np.ndarray) -> np.ndarray:
  pi = np.full(len(transitions), 1.0 / len(transitions))
  for _ in range(10_000):
    new = pi @ transitions
    if np.abs(new - pi).max() < 1e-12:
      return new / new.sum()
    pi = new
  raise RuntimeError("stationary distribution did not converge")  # a bug: P is irreducible


def entropy_rate(transitions: np.ndarray) -> float:
  """Exact entropy rate in nats per token."""
  pi = stationary_distribution(transitions)
  logs = np.log(transitions, where=transitions > 0, out=np.zeros_like(transitions))
  return float(-(pi * (transitions * logs).sum(axis=1)).sum())


def unigram_entropy(transitions: np.ndarray) -> float:
  """H(pi) in nats: the loss of predicting every token from the token frequencies alone, the
  plateau a model sits on before it uses any context."""
  pi = stationary_distribution(transitions)
  return float(-(pi * np.log(pi)).sum())


def topic_sets(vocab_size: int, dialects: int, seed: int) -> np.ndarray:
  """int [dialects, m]: each dialect's topic tokens, disjoint sets of m = (V - V // 4) //
  dialects tokens from a seeded permutation of the rarer three quarters of the vocabulary (ids
  V // 4 and up, where the Zipf law puts little mass, so a topic token stands out)."""
  pool = np.random.default_rng((seed, 0)).permutation(np.arange(vocab_size // 4, vocab_size))
  size = len(pool) // dialects
  return pool[: size * dialects].reshape(dialects, size)


def dialect_matrices(vocab_size: int, branching: int, seed: int, dialects: int = 1,
                     weight: float = 0.0) -> np.ndarray:
  """float64 [dialects, V, V]: each dialect's transition matrix P_z = (1 - w) P + w 1 T_z
  (the module docstring); one dialect is the chain P itself."""
  shared = transition_matrix(vocab_size, branching, seed)
  if dialects == 1:
    return shared[None]
  topics = np.zeros((dialects, vocab_size))
  for z, tokens in enumerate(topic_sets(vocab_size, dialects, seed)):
    topics[z, tokens] = 1.0 / len(tokens)
  return (1 - weight) * shared[None] + weight * topics[:, None, :]


def mixture_unigram_entropy(matrices: np.ndarray) -> float:
  """The entropy of the corpus's token frequencies (the dialects' stationary laws averaged):
  the loss of a model that uses no context."""
  pi = np.mean([stationary_distribution(p) for p in matrices], axis=0)
  return float(-(pi * np.log(pi)).sum())


def masked_posteriors(transitions: np.ndarray, tokens: np.ndarray, mask: np.ndarray,
                      with_likelihood: bool = False):
  """float64 [rows, length, V]: p(x_t = v | the row's visible tokens) for every position, by
  forward-backward over the chain (rows start from the stationary law, as `sample_documents`'s
  do in the stream): a visible token is known, a masked one is summed over. With
  `with_likelihood`, also float64 [rows]: log p(the row's visible tokens). O(rows x length x
  V^2): the reference the floors' `true_token_posteriors` is tested against."""
  rows, length = tokens.shape
  vocab = len(transitions)
  pi = stationary_distribution(transitions)
  evidence = np.where(mask[..., None], 1.0, np.eye(vocab)[tokens])  # [rows, length, V]
  forward = np.empty((rows, length, vocab))
  log_likelihood = np.zeros(rows)
  message = np.broadcast_to(pi, (rows, vocab))
  for t in range(length):
    message = message * evidence[:, t]
    total = message.sum(axis=1, keepdims=True)
    log_likelihood += np.log(total[:, 0])
    message = message / total
    forward[:, t] = message
    message = message @ transitions
  backward = np.empty_like(forward)
  message = np.ones((rows, vocab))
  for t in range(length - 1, -1, -1):
    backward[:, t] = message
    message = (evidence[:, t] * message) @ transitions.T
    message = message / message.sum(axis=1, keepdims=True)
  posterior = forward * backward
  posterior = posterior / posterior.sum(axis=2, keepdims=True)
  return (posterior, log_likelihood) if with_likelihood else posterior


def mixture_posteriors(matrices: np.ndarray, tokens: np.ndarray,
                       mask: np.ndarray) -> np.ndarray:
  """`masked_posteriors` for the dialect mixture: each dialect's posterior weighted by
  p(z | the row's visible tokens), the dialects equally likely a priori."""
  if len(matrices) == 1:
    return masked_posteriors(matrices[0], tokens, mask)
  posteriors, log_likelihoods = zip(*(masked_posteriors(p, tokens, mask, with_likelihood=True)
                                      for p in matrices))
  log_likelihoods = np.stack(log_likelihoods)  # [dialects, rows]
  weights = np.exp(log_likelihoods - log_likelihoods.max(axis=0))
  weights /= weights.sum(axis=0)
  return np.einsum("zr,zrlv->rlv", weights, np.stack(posteriors))


def _neighbours(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(left, right) [rows, length]: the nearest visible position before each position (-1 if
  none) and after it (length if none)."""
  rows, length = mask.shape
  positions = np.broadcast_to(np.arange(length), mask.shape)
  visible_at = np.where(mask, -1, positions)
  left = np.maximum.accumulate(np.concatenate([np.full((rows, 1), -1), visible_at[:, :-1]], 1),
                               axis=1)
  visible_at = np.where(mask, length, positions)
  right = np.minimum.accumulate(np.concatenate(
      [visible_at[:, 1:], np.full((rows, 1), length)], 1)[:, ::-1], axis=1)[:, ::-1]
  return left, right


def true_token_posteriors(transitions: np.ndarray, tokens: np.ndarray, mask: np.ndarray):
  """(p(x_t = the true token | the row's visible tokens) [rows, length], 1 where visible;
  log p(the row's visible tokens) [rows]) for one chain, what the floors need of
  `masked_posteriors` without its [rows, length, V] work: a masked x_t between the visible x_s
  and x_e has p(x_t = v | visible) = P^(t-s)[x_s, v] P^(e-t)[v, x_e] / P^(e-s)[x_s, x_e]
  (Chapman-Kolmogorov), with pi in place of P^(t-s)[x_s, .] before the first visible token and 1
  in place of P^(e-t)[., x_e] after the last."""
  rows, length = tokens.shape
  tokens = tokens.astype(np.int64)
  pi = stationary_distribution(transitions)
  left, right = _neighbours(mask)
  has_left, has_right = left >= 0, right < length
  t = np.broadcast_to(np.arange(length), mask.shape)
  gaps = np.where(has_left & has_right, right - left, 1)
  needed = max(int(gaps.max()), int(np.where(has_left, t - left, 0).max()),
               int(np.where(has_right, right - t, 0).max()))
  powers = [np.eye(len(transitions))]
  for _ in range(needed):
    powers.append(powers[-1] @ transitions)
  powers = np.stack(powers)
  x = tokens
  x_left = np.take_along_axis(tokens, np.maximum(left, 0), axis=1)
  x_right = np.take_along_axis(tokens, np.minimum(right, length - 1), axis=1)
  before = np.where(has_left, powers[np.where(has_left, t - left, 0), x_left, x], pi[x])
  after = np.where(has_right, powers[np.where(has_right, right - t, 0), x, x_right], 1.0)
  norm = np.where(has_left & has_right, powers[gaps, x_left, x_right],
                  np.where(has_right & ~has_left, pi[x_right], 1.0))
  truth = np.where(mask, before * after / norm, 1.0)
  # The visible tokens' likelihood: pi for the first, P^gap from the one before for the others.
  step = np.where(has_left, powers[np.where(has_left, t - left, 0), x_left, x], pi[x])
  log_likelihood = np.where(mask, 0.0, np.log(step)).sum(axis=1)
  return truth, log_likelihood


def causal_log_probs(matrices: np.ndarray, tokens: np.ndarray) -> np.ndarray:
  """float64 [rows, length - 1]: log p(x_t | x_<t) for t = 1..length-1 (the positions a causal
  model predicts), under the dialect mixture with rows started from each dialect's stationary
  law."""
  tokens = tokens.astype(np.int64)
  step_logs = np.log(matrices[:, tokens[:, :-1], tokens[:, 1:]])  # [dialects, rows, length-1]
  start_logs = np.log(np.stack([stationary_distribution(p) for p in matrices]))[:, tokens[:, 0]]
  # log p(z, x_<t) for t = 1..length-1: the start, then the transitions before t.
  joint = start_logs[..., None] + np.concatenate(
      [np.zeros(step_logs.shape[:2] + (1,)), np.cumsum(step_logs, axis=2)[..., :-1]], axis=2)
  joint -= joint.max(axis=0)
  posterior = np.exp(joint) / np.exp(joint).sum(axis=0)
  return np.log(np.sum(posterior * np.exp(step_logs), axis=0))


def _ratio_estimate(per_row: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
  """(sum per_row / sum counts, its standard error over rows, as a ratio estimate)."""
  floor = per_row.sum() / counts.sum()
  residual = per_row - floor * counts
  stderr = np.sqrt(len(per_row) / max(len(per_row) - 1, 1) * np.sum(residual ** 2)) / counts.sum()
  return float(floor), float(stderr)


def causal_loss_floor(matrices: np.ndarray, tokens: np.ndarray) -> tuple[float, float]:
  """(the Bayes-optimal next-token loss of a causal model on rows like `tokens`, its standard
  error): the mean over predicted positions of -log p(x_t | x_<t), exact per row."""
  losses = -causal_log_probs(matrices, tokens)
  return _ratio_estimate(losses.sum(axis=1), np.full(len(losses), losses.shape[1]))


def _mixture_truth(matrices: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """[rows, length]: p(x_t = the true token | visible tokens) under the dialect mixture, each
  dialect's `true_token_posteriors` weighted by p(z | the row's visible tokens)."""
  truths, log_likelihoods = zip(*(true_token_posteriors(p, tokens, mask) for p in matrices))
  log_likelihoods = np.stack(log_likelihoods)  # [dialects, rows]
  weights = np.exp(log_likelihoods - log_likelihoods.max(axis=0))
  weights /= weights.sum(axis=0)
  return np.einsum("zr,zrl->rl", weights, np.stack(truths))


def masked_loss_floor(transitions: np.ndarray, tokens: np.ndarray,
                      mask: np.ndarray) -> tuple[float, float]:
  """(the Bayes-optimal masked-prediction loss, its standard error): the mean over masked
  positions of -log p(true token | visible tokens), a Monte Carlo estimate over the given rows
  and masks (the standard error from the rows' spread, as a ratio estimate). `transitions`:
  one chain [V, V], or the dialects' matrices [D, V, V]."""
  matrices = transitions if transitions.ndim == 3 else transitions[None]
  truth = _mixture_truth(matrices, tokens, mask)
  losses = np.where(mask, -np.log(np.maximum(truth, 1e-300)), 0.0)
  return _ratio_estimate(losses.sum(axis=1), mask.sum(axis=1))


def sample_documents(transitions: np.ndarray, num_docs: int, length: int,
                     seed: int) -> np.ndarray:
  """int32 [num_docs, length]: chains started from the stationary law, sampled by inverse CDF."""
  rng = np.random.default_rng(seed)
  cdf = np.cumsum(transitions, axis=1)
  cdf[:, -1] = 1.0
  pi_cdf = np.cumsum(stationary_distribution(transitions))
  pi_cdf[-1] = 1.0
  docs = np.empty((num_docs, length), np.int32)
  docs[:, 0] = np.searchsorted(pi_cdf, rng.random(num_docs), side="right")
  for t in range(1, length):
    u = rng.random(num_docs)
    docs[:, t] = (u[:, None] >= cdf[docs[:, t - 1]]).sum(axis=1)
  return docs


def window_loss_floor(matrices: np.ndarray, tokens: np.ndarray, mask: np.ndarray,
                      half: int) -> float:
  """The Bayes-optimal masked-prediction loss of a model that sees only the tokens within `half`
  positions of the one it predicts (e.g. a model without attention whose only context is a conv
  of width 2 half + 1): the mean over masked positions of -log p(x_t | the visible tokens of
  x_t-half..x_t+half). A lower bound on any such model's loss; the gap to `masked_loss_floor` is
  what reading the whole row is worth. Positions past the row's ends count as masked: summed
  over, which for a stationary chain is the same as not being there."""
  rows, length = tokens.shape
  width = 2 * half + 1
  padded = np.pad(tokens, ((0, 0), (half, half)))
  hidden = np.pad(mask, ((0, 0), (half, half)), constant_values=True)
  where = np.arange(length)[:, None] + np.arange(width)[None, :]
  chosen = mask.reshape(-1)
  windows = padded[:, where].reshape(-1, width)[chosen]
  hidden = hidden[:, where].reshape(-1, width)[chosen]
  truth = _mixture_truth(matrices, windows, hidden)[:, half]
  return float(-np.log(truth).sum() / max(chosen.sum(), 1))


def sample_mixture_documents(matrices: np.ndarray, num_docs: int, length: int,
                             seed) -> np.ndarray:
  """int32 [num_docs, length]: each document a stationary chain of its own dialect, drawn
  uniformly; one dialect is `sample_documents` itself (the same bits)."""
  if len(matrices) == 1:
    return sample_documents(matrices[0], num_docs, length, seed)
  seed = list(np.atleast_1d(seed))
  dialect = np.random.default_rng(seed).integers(len(matrices), size=num_docs)
  docs = np.empty((num_docs, length), np.int32)
  for z, transitions in enumerate(matrices):
    chosen = np.flatnonzero(dialect == z)
    if len(chosen):
      docs[chosen] = sample_documents(transitions, len(chosen), length, seed + [z + 1])
  return docs


class SyntheticMarkovConfig(tfds.core.BuilderConfig):

  def __init__(self, *, vocab_size: int, branching: int, seed: int, train_tokens: int,
               validation_tokens: int, dialects: int = 1, dialect_weight: float = 0.0):
    name = f"v{vocab_size}_k{branching}_s{seed}_t{train_tokens}_e{validation_tokens}"
    if dialects > 1:  # the chain keeps its name (and its prepared datasets)
      name += f"_d{dialects}_w{dialect_weight:g}"
    super().__init__(name=name, description="seeded sparse Markov chain" if dialects == 1 else
                     f"{dialects} dialects of a seeded sparse Markov chain")
    self.dialects = dialects
    self.dialect_weight = dialect_weight
    self.vocab_size = vocab_size
    self.branching = branching
    self.seed = seed
    self.train_tokens = train_tokens
    self.validation_tokens = validation_tokens


class SyntheticMarkov(tfds.core.GeneratorBasedBuilder):
  """TFDS builder of the synthetic language; prepares offline, in array_record."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = []  # Configs are made from config.data, one per vocabulary/seed/size.

  def _info(self):
    cfg = self.builder_config
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict(
            {"tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32)}),
        # entropy_rate: of the chain; of the dialect mixture, the dialects' mean (the loss of a
        # model told the dialect, on a long row).
        metadata=tfds.core.MetadataDict(
            entropy_rate=float(np.mean([entropy_rate(p) for p in self.matrices()])),
            vocab_size=cfg.vocab_size),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing is downloaded, ever.
    cfg = self.builder_config
    return {
        "train": self._generate_examples(cfg.train_tokens, sample_seed=1),
        "validation": self._generate_examples(cfg.validation_tokens, sample_seed=2),
    }

  def matrices(self) -> np.ndarray:
    cfg = self.builder_config
    return dialect_matrices(cfg.vocab_size, cfg.branching, cfg.seed, cfg.dialects,
                            cfg.dialect_weight)

  def _generate_examples(self, num_tokens: int, sample_seed: int):
    cfg = self.builder_config
    num_docs = max(1, -(-num_tokens // DOC_LENGTH))
    docs = sample_mixture_documents(self.matrices(), num_docs, DOC_LENGTH,
                                    seed=(cfg.seed, sample_seed))
    for i, doc in enumerate(docs):
      yield i, {"tokens": doc}


def builder(data_cfg, vocab_size: int) -> SyntheticMarkov:
  tfds.disable_progress_bar()  # preparing takes a second; its bars would swamp the run's log
  return SyntheticMarkov(
      config=SyntheticMarkovConfig(
          vocab_size=vocab_size, branching=data_cfg.branching, seed=data_cfg.seed,
          train_tokens=data_cfg.train_tokens, validation_tokens=data_cfg.validation_tokens,
          dialects=data_cfg.dialects, dialect_weight=data_cfg.dialect_weight),
      data_dir=data_cfg.data_dir)
