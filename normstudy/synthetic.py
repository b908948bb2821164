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


def masked_posteriors(transitions: np.ndarray, tokens: np.ndarray,
                      mask: np.ndarray) -> np.ndarray:
  """float64 [rows, length, V]: p(x_t = v | the row's visible tokens) for every position, by
  forward-backward over the chain (rows start from the stationary law, as `sample_documents`'s
  do in the stream): a visible token is known, a masked one is summed over."""
  rows, length = tokens.shape
  vocab = len(transitions)
  pi = stationary_distribution(transitions)
  evidence = np.where(mask[..., None], 1.0, np.eye(vocab)[tokens])  # [rows, length, V]
  forward = np.empty((rows, length, vocab))
  message = np.broadcast_to(pi, (rows, vocab))
  for t in range(length):
    message = message * evidence[:, t]
    message = message / message.sum(axis=1, keepdims=True)
    forward[:, t] = message
    message = message @ transitions
  backward = np.empty_like(forward)
  message = np.ones((rows, vocab))
  for t in range(length - 1, -1, -1):
    backward[:, t] = message
    message = (evidence[:, t] * message) @ transitions.T
    message = message / message.sum(axis=1, keepdims=True)
  posterior = forward * backward
  return posterior / posterior.sum(axis=2, keepdims=True)


_FLOOR_CHUNK = 1024  # rows per forward-backward pass: 1024 x 64 x 256 float64 is 128 MiB


def masked_loss_floor(transitions: np.ndarray, tokens: np.ndarray,
                      mask: np.ndarray) -> tuple[float, float]:
  """(the Bayes-optimal masked-prediction loss, its standard error): the mean over masked
  positions of -log p(true token | visible tokens), a Monte Carlo estimate over the given rows
  and masks (the standard error from the rows' spread, as a ratio estimate)."""
  truth = np.empty(tokens.shape)
  for start in range(0, len(tokens), _FLOOR_CHUNK):  # [rows, length, V] float64 per chunk
    rows = slice(start, start + _FLOOR_CHUNK)
    posterior = masked_posteriors(transitions, tokens[rows], mask[rows])
    truth[rows] = np.take_along_axis(posterior, tokens[rows, :, None].astype(np.int64),
                                     axis=2)[..., 0]
  losses = np.where(mask, -np.log(np.maximum(truth, 1e-300)), 0.0)
  per_row, counts = losses.sum(axis=1), mask.sum(axis=1)
  floor = per_row.sum() / counts.sum()
  residual = per_row - floor * counts
  stderr = np.sqrt(len(per_row) / max(len(per_row) - 1, 1) * np.sum(residual ** 2)) / counts.sum()
  return float(floor), float(stderr)


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


class SyntheticMarkovConfig(tfds.core.BuilderConfig):

  def __init__(self, *, vocab_size: int, branching: int, seed: int, train_tokens: int,
               validation_tokens: int):
    name = f"v{vocab_size}_k{branching}_s{seed}_t{train_tokens}_e{validation_tokens}"
    super().__init__(name=name, description="seeded sparse Markov chain")
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
        metadata=tfds.core.MetadataDict(
            entropy_rate=entropy_rate(
                transition_matrix(cfg.vocab_size, cfg.branching, cfg.seed)),
            vocab_size=cfg.vocab_size),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing is downloaded, ever.
    cfg = self.builder_config
    return {
        "train": self._generate_examples(cfg.train_tokens, sample_seed=1),
        "validation": self._generate_examples(cfg.validation_tokens, sample_seed=2),
    }

  def _generate_examples(self, num_tokens: int, sample_seed: int):
    cfg = self.builder_config
    transitions = transition_matrix(cfg.vocab_size, cfg.branching, cfg.seed)
    num_docs = max(1, -(-num_tokens // DOC_LENGTH))
    docs = sample_documents(transitions, num_docs, DOC_LENGTH, seed=(cfg.seed, sample_seed))
    for i, doc in enumerate(docs):
      yield i, {"tokens": doc}


def builder(data_cfg, vocab_size: int) -> SyntheticMarkov:
  tfds.disable_progress_bar()  # preparing takes a second; its bars would swamp the run's log
  return SyntheticMarkov(
      config=SyntheticMarkovConfig(
          vocab_size=vocab_size, branching=data_cfg.branching, seed=data_cfg.seed,
          train_tokens=data_cfg.train_tokens, validation_tokens=data_cfg.validation_tokens),
      data_dir=data_cfg.data_dir)
