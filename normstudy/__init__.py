"""normstudy: which block design and which clipping keep a transformer run alive, and at what cost."""

import os

# TensorFlow is only used to write TensorBoard event files (clu) and, for gs:// paths, gfile.
# Without these it prints two lines at import (an absl pre-init warning and a oneDNN notice):
# noise a researcher would have to learn to ignore. Set before any TensorFlow import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def __getattr__(name):
  # Config files written before the layers became packages (2026-12) import the schema as
  # `from normstudy import config`; it lives in normstudy.core.config now.
  if name == "config":
    from normstudy.core import config
    return config
  raise AttributeError(f"module 'normstudy' has no attribute {name!r}")
