"""A GCS API server on 127.0.0.1 for the gs:// tests (gcp-storage-emulator, its own process,
in memory), and the environment that points gcsfs and tensorstore at it, as their docs say."""

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request

import runs

BUCKET = "normstudy-test"  # tensorstore refuses bucket names under 3 characters


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def emulator(log_path):
  """Yields the environment for processes that use the server (and the stage directory)."""
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  with open(log_path, "w") as log:
    server = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      "gcs_server.py"), str(port), BUCKET],
        stdout=log, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + runs.bound(60)
    while True:
      try:
        urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}", timeout=1)
        break
      except OSError:
        if time.time() > deadline or server.poll() is not None:
          raise RuntimeError(f"the GCS emulator did not start; see {log_path}")
        time.sleep(0.1)
    yield {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "EPATH_USE_TF": "false"}
  finally:
    server.terminate()
    server.wait(timeout=runs.bound(30))
