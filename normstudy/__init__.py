"""normstudy: which block design and which clipping keep a transformer run alive, and at what cost."""

import os

# TensorFlow (pulled in by tensorflow-datasets and clu) prints C++ INFO lines at import otherwise.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
