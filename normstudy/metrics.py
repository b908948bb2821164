"""`metrics.jsonl`: one JSON object per logged step, the record every analysis reads.

Non-finite values are written as JSON's common extensions `NaN` / `Infinity` (Python's json and
pandas read them): a diverged run's record must show the divergence, not hide it.
"""

import json
import os
from typing import Iterator

from absl import logging

FILENAME = "metrics.jsonl"


def plain(value):
  """numpy/jax scalars -> Python scalars (bools stay bools, so JSON shows true/false)."""
  return value.item() if hasattr(value, "item") else value


def read_records(path: str) -> Iterator[dict]:
  """Yields the records of a metrics file. A torn last line (a crash mid-write) is skipped with a
  warning; a damaged line elsewhere is a real error and raises."""
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  for i, line in enumerate(lines):
    try:
      yield json.loads(line)
    except json.JSONDecodeError:
      if i == len(lines) - 1:
        logging.warning("%s: skipping a torn last line (%d bytes)", path, len(line))
        return
      raise ValueError(f"{path}:{i + 1}: not a JSON record: {line[:80]!r}") from None


class MetricsLog:
  """Appends records; on resume, drops every record after the restored step first."""

  def __init__(self, workdir: str, resume_step: int | None):
    self.path = os.path.join(workdir, FILENAME)
    if os.path.exists(self.path):
      keep = []
      if resume_step is not None:
        keep = [r for r in read_records(self.path) if r["step"] <= resume_step]
      tmp = self.path + ".tmp"
      with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in keep)
      os.replace(tmp, self.path)
    self._file = open(self.path, "a", encoding="utf-8")

  def write(self, record: dict) -> None:
    self._file.write(json.dumps({k: plain(v) for k, v in record.items()}) + "\n")
    self._file.flush()  # visible to a notebook watching the run; fsync waits for flush()

  def flush(self) -> None:
    """Makes every record so far durable (called at each checkpoint and on exit)."""
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self) -> None:
    if not self._file.closed:
      self.flush()
      self._file.close()


class NullLog:
  """The MetricsLog of processes other than 0: they write nothing."""

  def write(self, record: dict) -> None:
    del record

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass
