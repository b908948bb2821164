"""`metrics.jsonl`: one JSON object per logged step, the record every analysis reads.

Every line is strict JSON. A non-finite value is written as the string "NaN", "Infinity" or
"-Infinity" (a diverged run's record must show the divergence, not hide it) and read back as
the float by `read_records`; JSON itself has no literal for them, and the `NaN` extension of
Python's json is refused by strict parsers.
"""

import json
import math
import os
import shutil
from typing import Iterator

from absl import logging

from normstudy.records import schema


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def plain(value):
  """numpy/jax scalars -> Python scalars (bools stay bools, so JSON shows true/false)."""
  return value.item() if hasattr(value, "item") else value


def encode(record: dict) -> str:
  """One strict-JSON line for a record; non-finite floats as the strings of _NONFINITE."""
  def finite_or_name(value):
    value = plain(value)
    if isinstance(value, float) and not math.isfinite(value):
      return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value
  return json.dumps({k: finite_or_name(v) for k, v in record.items()}, allow_nan=False)


def decode(line: str) -> dict:
  """A record from its line: the strings of _NONFINITE back to floats."""
  record = json.loads(line)
  if isinstance(record, dict):
    record = {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in record.items()}
  return record


class DamagedRecords(ValueError):
  """A metrics file holds a line that is not a JSON record, before its last line."""


def read_records(path: str, skip_damaged: bool = False) -> Iterator[dict]:
  """Yields the records of a metrics file. A torn last line (a crash mid-write) is skipped with a
  warning. A damaged line elsewhere raises DamagedRecords naming the file and line, or, with
  `skip_damaged` (the analysis), is skipped with a warning naming them."""
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = f.read().split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  for i, line in enumerate(lines):
    try:
      record = decode(line)
      step = record.get("step") if isinstance(record, dict) else None
      if not isinstance(step, int) or isinstance(step, bool):  # "60", 60.5, true: damaged
        raise ValueError("not a record")
    except ValueError:
      if i == len(lines) - 1:
        logging.warning("%s:%d: skipping a torn last line (%d bytes)", path, i + 1, len(line))
        return
      if skip_damaged:
        logging.warning("%s:%d: skipping a damaged line: %r", path, i + 1, line[:80])
        continue
      raise DamagedRecords(f"{path}:{i + 1}: not a JSON record: {line[:80]!r}") from None
    yield record


def recorded_span(path: str):
  """(records, first step, last step) of a metrics file, (0, None, None) when it has none."""
  if not os.path.exists(path):
    return 0, None, None
  steps = [r["step"] for r in read_records(path, skip_damaged=True)]
  return len(steps), min(steps, default=None), max(steps, default=None)


def first_lost_step(path: str, run_step: int):
  """The first step whose record a run that reached `run_step` has lost, or None if its records
  are intact: a damaged line (other than a torn last line) loses the steps after the record
  before it, a missing file all of them, and records that end before `run_step` (the loop always
  records a checkpointed or stopping step) the steps after their end."""
  if run_step <= 0:
    return None
  if not os.path.exists(path):
    return 1
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = f.read().split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  last_good = 0
  for i, line in enumerate(lines):
    try:
      record = json.loads(line)
      step = record["step"] if isinstance(record, dict) else None
    except ValueError:
      step = None
    if not isinstance(step, int):
      if i < len(lines) - 1:
        return last_good + 1
      break  # a torn last line: the check below decides whether it held a needed record
    last_good = step
  return last_good + 1 if last_good < run_step else None


class MetricsLog:
  """Appends records; on resume, drops every record after the restored step first (and any
  damaged line, which the resume has already regenerated). Started over (`resume_step` None),
  it adds the records it had to schema.METRICS_BEFORE_RESTART (after those of an earlier
  restart) rather than lose them."""

  def __init__(self, workdir: str, resume_step: int | None):
    self.path = os.path.join(workdir, schema.METRICS)
    if os.path.exists(self.path):
      keep = []
      if resume_step is not None:
        keep = [r for r in read_records(self.path, skip_damaged=True)
                if r["step"] <= resume_step]
      elif os.path.getsize(self.path):  # after those of an earlier restart, if any
        with open(self.path, "rb") as old, open(
            os.path.join(workdir, schema.METRICS_BEFORE_RESTART), "ab") as kept:
          shutil.copyfileobj(old, kept)
      tmp = self.path + ".tmp"
      with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(encode(r) + "\n" for r in keep)
      os.replace(tmp, self.path)
    self._file = open(self.path, "a", encoding="utf-8")

  def write(self, record: dict) -> None:
    self._file.write(encode(record) + "\n")
    self._file.flush()  # visible to a notebook watching the run; fsync waits for flush()

  def flush(self) -> None:
    """Makes every record so far durable (called at each checkpoint and on exit)."""
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self) -> None:
    if not self._file.closed:
      self.flush()
      self._file.close()
