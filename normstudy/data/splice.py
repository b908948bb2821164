"""Rows whose context beyond a window comes from another document: what a masked-prediction
model takes from context, measured by taking it away.

For each masked segment (a maximal run of masked positions) of a row, `splice_segments` makes one
row that keeps the tokens within `window` positions of the segment and takes every other token
from a donor row of another document; the mask stays the row's, so the model sees the same
pattern of masked positions and the same local neighbourhood around the segment. The segment's
loss on that row against its loss on the intact row is the context's share: a model that reads
nothing beyond `window` (a block without attention, whose only context is the position
convolution's 5-token window, `window` = 2) predicts the segment as before, up to rounding.
"""

import numpy as np


def segments(mask_row: np.ndarray) -> list[tuple[int, int]]:
  """[(first, last)] of every maximal run of True in a 1-D mask, in order."""
  padded = np.concatenate([[False], np.asarray(mask_row, bool), [False]])
  edges = np.flatnonzero(padded[1:] != padded[:-1])
  return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]


def splice_segments(tokens: np.ndarray, mask: np.ndarray, donors: np.ndarray,
                    window: int) -> dict:
  """One spliced row per masked segment of each row of `tokens` [R, L] (`mask` [R, L]), its
  tokens beyond `window` positions of the segment from the same row of `donors` [R, L].

  Returns {"tokens", "mask" (the row's whole mask), "target" (the segment's positions), each
  [S, L], and "row" [S] (the row each came from)}."""
  if window < 0:
    raise ValueError(f"window must be >= 0, not {window}")
  tokens, mask, donors = (np.asarray(x) for x in (tokens, mask, donors))
  if not tokens.shape == mask.shape == donors.shape:
    raise ValueError(f"tokens {tokens.shape}, mask {mask.shape} and donors {donors.shape} "
                     "must have one shape")
  length = tokens.shape[1]
  out = {"tokens": [], "mask": [], "target": [], "row": []}
  positions = np.arange(length)
  for r in range(len(tokens)):
    for first, last in segments(mask[r]):
      kept = (positions >= first - window) & (positions <= last + window)
      target = (positions >= first) & (positions <= last)
      out["tokens"].append(np.where(kept, tokens[r], donors[r]))
      out["mask"].append(mask[r])
      out["target"].append(target)
      out["row"].append(r)
  if not out["row"]:
    raise ValueError("no masked position: nothing to predict")
  return {"tokens": np.stack(out["tokens"]).astype(tokens.dtype), "mask": np.stack(out["mask"]),
          "target": np.stack(out["target"]), "row": np.asarray(out["row"])}
