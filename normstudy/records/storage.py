"""Where a workdir lives: a local directory, or a URL (`gs://bucket/path`) staged on this host.

  staged(workdir, writer)   context: the local directory to work in (a URL's stage), uploaded
                            when it closes; a local workdir is returned as it is
  push(local_dir)           uploads what changed below `local_dir` to its URL (if it is staged)
  remote(path)              the URL a staged local path stands for (a checkpoint directory)
  pull(url, local_dir)      the run files below `url` (no checkpoints) copied into `local_dir`
  is_url(path)

Object storage has no append, no rename and no lock, so a URL workdir is *staged*: its run
files (config.json, run.json, metrics.jsonl, study.json, sweep.json, TensorBoard events, the
analysis' tables, figures and observations) are read from the bucket into a local mirror when
the command starts, written there with ordinary file operations, and uploaded at every
checkpoint (before the checkpoint is saved: the bucket's records always reach its newest
checkpoint) and when the command ends. Each upload replaces an object whole and atomically (a
reader sees the old file or the new one). Checkpoints are not staged: orbax writes them straight
to the URL (tensorstore's GCS driver), as on any pod. What a SIGKILL loses is what a local run
loses: the steps after the newest checkpoint, which the resume recomputes bit-exactly.

A lock on object storage is a lease (`Lease`): the object `<url>/.normstudy.lock` names its
holder (host, pid) and is rewritten every LEASE_REFRESH_S seconds. A second command refuses the
workdir while the holder is alive: on this host, while its pid lives; from another host, until
the lease is LEASE_EXPIRY_S seconds old (a killed holder's lease then lapses by itself). Taking a
lease is write-then-read-back, not an atomic create (GCS preconditions are not in every server):
two commands started within the same second on one workdir can both proceed, as with any
advisory lock on shared storage.

URLs are read and written through etils.epath with its fsspec backend (gcsfs; EPATH_USE_TF=false
is set here, as tf.io.gfile cannot be pointed at a local GCS server), and orbax's arrays through
tensorstore. A GCS emulator is reached the way each library documents: STORAGE_EMULATOR_HOST
(gcsfs) and TENSORSTORE_GCS_HTTP_URL (tensorstore).
"""

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
import urllib.parse

from absl import logging

from normstudy.errors import UserError
from normstudy.errors import WorkdirBusy
from normstudy.records import schema

# etils.epath reads these when it opens a path (and gcsfs when it is imported): the fsspec
# backend (gcsfs) for gs://, and, against an emulator, no probe of the bucket's type over gRPC
# (gcsfs 2026.10 otherwise spends a 60 s timeout on it before falling back).
os.environ.setdefault("EPATH_USE_TF", "false")
if os.environ.get("STORAGE_EMULATOR_HOST"):
  os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# This process tree's stages, {local root: URL}, in the environment so that worker processes
# (normstudy.experiments.workers spawns them) map the same paths.
STAGES_ENV = "NORMSTUDY_STAGES"
STAGE_DIR_ENV = "NORMSTUDY_STAGE_DIR"
LEASE_REFRESH_S = 60.0
LEASE_EXPIRY_S = 600.0
_NOT_STAGED = (schema.CHECKPOINTS, schema.DAMAGED_CHECKPOINTS)

# (size, mtime_ns) of each staged file as this process last pulled or pushed it (only the main
# thread pulls and pushes).
_synced: dict = {}


def is_url(path) -> bool:
  return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", os.fspath(path)))


def _path(url: str):
  from etils import epath
  return epath.Path(url)


def stage_dir(url: str, reader: bool = False) -> str:
  """The local mirror of `url`: $NORMSTUDY_STAGE_DIR (default ~/.cache/normstudy/staged)/
  <digest of the URL>/<bucket>/<path> (the last part kept: a run is named after it); a reading
  process (not the writer of a multi-process run) has its own, which the writer's never sees."""
  root = os.environ.get(STAGE_DIR_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "normstudy", "staged")
  rest = url.split("://", 1)[1]
  digest = hashlib.sha1(url.encode()).hexdigest()[:10]
  digest += f"-reader{os.getpid()}" if reader else ""
  return os.path.join(os.path.abspath(root), digest,
                      *[p for p in rest.split("/") if p not in ("", ".", "..")])


def _stages() -> dict:
  return json.loads(os.environ.get(STAGES_ENV) or "{}")


def _stage_of(path: str):
  """(local root, URL) of the stage holding the local `path`, or None."""
  path = os.path.abspath(path)
  for local, url in _stages().items():
    if path == local or path.startswith(local + os.sep):
      return local, url
  return None


def remote(path: str) -> str:
  """The URL a path inside a stage stands for; any other path as it is."""
  path = os.fspath(path)
  stage = None if is_url(path) else _stage_of(path)
  if stage is None:
    return path
  local, url = stage
  relative = os.path.relpath(os.path.abspath(path), local)
  return url if relative == "." else f"{url}/{relative.replace(os.sep, '/')}"


def _is_staged(name: str) -> bool:
  """Whether a file of a run directory travels with the stage (not the lock, not a tmp)."""
  return name != schema.LOCK and not name.endswith(".tmp")


def _files(local_dir: str):
  for root, dirs, files in os.walk(local_dir):
    dirs[:] = [d for d in dirs if d not in _NOT_STAGED]
    yield from (os.path.join(root, name) for name in files if _is_staged(name))


def pull(url: str, local_dir: str, names=None) -> int:
  """Copies the files below `url` (but its checkpoints and lock; only those called one of
  `names`, if given) into `local_dir`; returns how many. A URL that does not exist yet copies
  nothing."""
  base = _path(url)
  count = 0
  if not base.exists():
    return 0
  bare = url.split("://", 1)[-1].rstrip("/")
  for root, dirs, files in base.walk():
    dirs[:] = [d for d in dirs if d not in _NOT_STAGED]
    # gcsfs gives the walk's directories without their scheme: the path below `url` only.
    relative = os.path.relpath(os.fspath(root).split("://", 1)[-1], bare)
    for name in files:
      if not _is_staged(name) or (names and name not in names):
        continue
      source = f"{url}/{name}" if relative == "." else f"{url}/{relative}/{name}"
      target = os.path.normpath(os.path.join(local_dir, relative, name))
      os.makedirs(os.path.dirname(target), exist_ok=True)
      with open(target, "wb") as f:
        f.write(_path(source).read_bytes())
      _synced[target] = _signature(target)
      count += 1
  return count


def _signature(path: str):
  st = os.stat(path)
  return st.st_size, st.st_mtime_ns


def push(local_dir: str) -> int:
  """Uploads each file below `local_dir` that changed since this process last synced it, if
  `local_dir` is in a stage (else does nothing); returns how many it uploaded."""
  stage = _stage_of(local_dir)
  if stage is None or not os.path.isdir(local_dir):
    return 0
  count = 0
  for path in _files(local_dir):
    try:
      signature = _signature(path)
    except FileNotFoundError:  # replaced (tmp + rename) while we walked
      continue
    if _synced.get(path) == signature:
      continue
    with open(path, "rb") as f:
      _path(remote(path)).write_bytes(f.read())
    _synced[path] = signature
    count += 1
  return count


class Lease:
  """The lock of a URL workdir (see the module docstring)."""

  def __init__(self, url: str):
    self.url = url
    self.path = _path(f"{url}/{schema.LOCK}")
    self.holder = {"host": socket.gethostname(), "pid": os.getpid(),
                   "token": os.urandom(8).hex()}
    self._stop = threading.Event()
    self._thread = None

  def _read(self):
    try:
      return json.loads(self.path.read_text())
    except (FileNotFoundError, ValueError):
      return None

  def _write(self) -> None:
    self.path.write_text(json.dumps({**self.holder, "refreshed": time.time()}))

  @staticmethod
  def alive(holder: dict) -> bool:
    if holder.get("host") == socket.gethostname():
      try:
        os.kill(int(holder.get("pid", -1)), 0)
      except ProcessLookupError:
        return False
      except (PermissionError, ValueError):
        return True
      return True
    return time.time() - float(holder.get("refreshed", 0)) < LEASE_EXPIRY_S

  def _busy(self, holder: dict) -> WorkdirBusy:
    age = time.time() - float(holder.get("refreshed", 0))
    return WorkdirBusy(
        f"{self.url} is in use by process {holder.get('pid')} on {holder.get('host')} (its "
        f"lease was renewed {age:.0f} s ago; a holder that stopped renewing it is taken over "
        f"after {LEASE_EXPIRY_S:.0f} s); wait for it to finish or stop it, or choose another "
        "--workdir")

  def acquire(self) -> "Lease":
    holder = self._read()
    if holder is not None and holder.get("token") != self.holder["token"] and self.alive(holder):
      raise self._busy(holder)
    self._write()
    holder = self._read()
    if holder is None or holder.get("token") != self.holder["token"]:
      raise self._busy(holder or {})
    self._thread = threading.Thread(target=self._renew, daemon=True, name="normstudy-lease")
    self._thread.start()
    return self

  def _renew(self) -> None:
    while not self._stop.wait(LEASE_REFRESH_S):
      try:
        self._write()
      except Exception:  # a failed renewal is retried; the lease lapses only after expiry
        pass

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
      holder = self._read()
      if holder is not None and holder.get("token") == self.holder["token"]:
        self.path.unlink(missing_ok=True)


def _endpoint() -> str:
  return os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"


def failure_line(url: str, error: BaseException) -> str | None:
  """The one line that says why the bucket of `url` could not be used, from what gcsfs raised
  (its HTTP status kept: gcsfs turns a 404 into a FileNotFoundError naming the request, a 403
  into an OSError starting "Forbidden"); None for an error that is no storage failure (a bug,
  whose traceback stays)."""
  from gcsfs.retry import HttpError
  bucket = url.split("://", 1)[1].split("/", 1)[0]
  text = " ".join(str(error).split())
  if isinstance(error, FileNotFoundError) and f"/b/{bucket}/" in text and not _bucket_exists(
      bucket):
    return (f"--workdir={url!r}: the bucket {bucket!r} does not exist (at {_endpoint()}); "
            f"create it (gcloud storage buckets create gs://{bucket}) or name another")
  if isinstance(error, PermissionError) or text.startswith("Forbidden") or (
      isinstance(error, HttpError) and getattr(error, "code", None) in (401, 403)):
    return (f"--workdir={url!r}: permission denied on the bucket {bucket!r} ({text[:120]}); "
            "the credentials in use (application-default, or GOOGLE_APPLICATION_CREDENTIALS) "
            "need read and write access to it")
  if isinstance(error, (ConnectionError, TimeoutError)) or "Cannot connect to host" in text:
    return _unreachable_line(url, text)
  if isinstance(error, (OSError, HttpError)):
    return f"--workdir={url!r} cannot be read: {text[:300]}"
  return None


def _unreachable_line(url: str, why: str) -> str:
  return (f"--workdir={url!r}: the storage endpoint {_endpoint()} cannot be reached "
          f"({why[:160]}); check the network (or STORAGE_EMULATOR_HOST for a local server)")


# The probe of the endpoint: after PROBE_SAY_AFTER_S without an answer it says that it is trying;
# after PROBE_GIVE_UP_S without a connection (a silent host, a name that does not resolve, no
# route) it answers that the endpoint cannot be reached. gcsfs's own retries would wait out
# six tries with backoff, about 35 s (gcsfs 2026.10), and a first slow connection more (72 s
# measured) before a line that blamed the network.
PROBE_SAY_AFTER_S = 5.0
PROBE_GIVE_UP_S = 25.0


def _host_and_port(endpoint: str) -> tuple:
  """(host, port) of the storage endpoint (a URL or host:port); UserError for one that names
  none (a malformed STORAGE_EMULATOR_HOST was once a ValueError traceback from the probe:
  'Port could not be cast to integer value')."""
  parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
  try:
    port = parts.port or (443 if parts.scheme == "https" else 80)
  except ValueError:  # a port that is no number, or out of range
    port = None
  if not parts.hostname or parts.scheme not in ("http", "https") or port is None:
    raise UserError(f"STORAGE_EMULATOR_HOST={endpoint!r} is not allowed; allowed: HOST:PORT or "
                    "http://HOST:PORT (a local storage server)")
  return parts.hostname, port


def refused_by(endpoint: str, clock=time.monotonic, sleep=time.sleep,
               say=logging.info) -> str | None:
  """Why nothing answers at the storage `endpoint` (a URL or host:port): its port refuses
  connections (a stopped emulator, a mistyped STORAGE_EMULATOR_HOST), or no connection could
  be made in PROBE_GIVE_UP_S; `say`s once, after PROBE_SAY_AFTER_S, that it is trying. None
  once a connection is accepted."""
  host, port = _host_and_port(endpoint)
  start, said, last = clock(), False, None
  while True:
    left = PROBE_GIVE_UP_S - (clock() - start)
    if left <= 0:
      return f"no connection in {PROBE_GIVE_UP_S:.0f} s; the last try: {last}"
    tried = clock()
    try:
      socket.create_connection((host, port), timeout=min(PROBE_SAY_AFTER_S, left)).close()
      return None
    except ConnectionRefusedError as e:
      return str(e)
    except OSError as e:  # a timeout, a name that does not resolve, no route: try again
      last = " ".join(str(e).split()) or type(e).__name__
    if not said and clock() - start >= PROBE_SAY_AFTER_S:
      say(f"the storage endpoint {endpoint} has not answered in {clock() - start:.0f} s "
          f"({last}); trying for up to {PROBE_GIVE_UP_S:.0f} s")
      said = True
    sleep(max(0.0, min(1.0 - (clock() - tried), PROBE_GIVE_UP_S - (clock() - start))))


def _bucket_exists(bucket: str) -> bool:
  """Whether the storage server knows the bucket (True when it cannot say)."""
  try:
    return _path(f"gs://{bucket}").exists()
  except Exception:  # noqa: BLE001 (an answer only when the server gives one)
    return True


# Cloud Storage's bucket names: lowercase letters, digits, '-', '_' and '.', beginning and ending
# with a letter or a digit (cloud.google.com/storage/docs/buckets#naming). Their 3-63 length is
# left to the service.
_BUCKET_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?")


def _check_url(url: str) -> None:
  scheme, sep, rest = url.partition("://")
  if not sep and url.endswith(":"):  # "gs://" with its slashes stripped
    scheme, rest = url[:-1], ""
  if scheme != "gs":
    raise UserError(f"--workdir={url!r}: {scheme}:// is not supported; allowed: a local path "
                    "or gs://BUCKET/PATH")
  bucket = rest.split("/", 1)[0]
  if not bucket:
    raise UserError(f"--workdir={url!r} names no bucket; allowed: gs://BUCKET/PATH")
  if not _BUCKET_NAME.fullmatch(bucket):
    raise UserError(f"--workdir={url!r}: {bucket!r} is not a Cloud Storage bucket name; "
                    "allowed: lowercase letters, digits, '-', '_' and '.', beginning and ending "
                    "with a letter or a digit")


def check_workdir(workdir: str) -> None:
  """UserError (one line) for a --workdir URL that cannot be used: a scheme other than gs://, no
  bucket, or an endpoint that refuses connections (refused_by). Cheap and free of JAX, so a
  command calls it before its training stack loads; `staged` calls it again."""
  if not is_url(workdir):
    return
  _check_url(workdir)  # as the user wrote it: "gs://" names no bucket
  url = workdir.rstrip("/")
  refused = refused_by(_endpoint())
  if refused is not None:  # before the lease: nothing is written, and no 35 s of retries
    raise UserError(_unreachable_line(url, refused))


@contextlib.contextmanager
def staged(workdir: str, writer: bool = True):
  """The directory a command works in for `workdir`: the workdir itself if it is local; for a
  URL, its stage, filled from the bucket (after taking its lease, when `writer`) and uploaded
  when the context closes (however it closes: a halt, a preemption, an error). Processes other
  than the writer (process 0 of a multi-process run) read the stage and upload nothing."""
  if not is_url(workdir):
    yield workdir
    return
  url = workdir.rstrip("/")
  check_workdir(url)
  local = stage_dir(url, reader=not writer)
  lease = None
  try:
    if writer:
      lease = Lease(url).acquire()
    if os.path.exists(local):
      shutil.rmtree(local)  # the bucket is the record; an earlier session's leftovers are not
    os.makedirs(local)
    pull(url, local)
  except Exception as e:  # noqa: BLE001 (storage's failures become one line; others re-raise)
    if lease is not None:
      with contextlib.suppress(Exception):
        lease.release()
    line = failure_line(url, e)
    if line is None:
      raise
    raise UserError(line) from None
  previous = os.environ.get(STAGES_ENV)
  os.environ[STAGES_ENV] = json.dumps({**_stages(), local: url})
  try:
    yield local
  finally:
    try:
      if writer:
        push(local)
    finally:
      if previous is None:
        os.environ.pop(STAGES_ENV, None)
      else:
        os.environ[STAGES_ENV] = previous
      if lease is not None:
        lease.release()
      if not writer:
        shutil.rmtree(local, ignore_errors=True)
