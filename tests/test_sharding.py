"""Meshes: equivalence across device layouts (8 fake devices), checkpoints across meshes,
multi-process runs on loopback, and the errors for layouts that do not fit."""

import json
import os
import socket
import subprocess
import sys

import pytest

from normstudy.core import placements
from normstudy.engine import sharding
from normstudy.errors import UserError
import runs
from conftest import parameter_layout
from conftest import tiny_config


def _mesh(data=-1, fsdp=1, tensor=1, runs=1):
  return {"runs": runs, "data": data, "fsdp": fsdp, "tensor": tensor}


def test_mesh_shape_resolves_minus_one_and_rejects_misfits():
  assert sharding.mesh_shape(_mesh(), 8) == {"runs": 1, "data": 8, "fsdp": 1, "tensor": 1}
  assert list(sharding.mesh_shape(_mesh(2, -1, 2), 8).values()) == [1, 2, 2, 2]
  assert list(sharding.mesh_shape(_mesh(1, 1, 1, runs=-1), 8).values()) == [8, 1, 1, 1]
  with pytest.raises(UserError, match="the mesh has 6 devices, but there are 8"):
    sharding.mesh_shape(_mesh(3, 2, 1), 8)
  with pytest.raises(UserError, match=r"fsdp=3 x tensor=1 asks for 3 devices \(or a multiple\) "
                     r"and there are 8; allowed: sizes whose product divides 8"):
    sharding.mesh_shape(_mesh(-1, 3, 1), 8)
  # Once "the other axes (2) do not divide the 1 devices" (issue 45).
  with pytest.raises(UserError, match=r"runs=2 x fsdp=1 x tensor=1 asks for 2 devices \(or a "
                     r"multiple\) and there is 1"):
    sharding.mesh_shape(_mesh(-1, 1, 1, runs=2), 1)
  with pytest.raises(UserError, match="at most one may be -1"):
    sharding.mesh_shape(_mesh(-1, -1, 1), 8)


def test_sizes_that_do_not_divide_are_named(make_config):
  config = make_config(num_heads=4, d_ff=64)
  config.train.batch_size = 4
  sharding.check_divisible(config, {"runs": 1, "data": 2, "fsdp": 2, "tensor": 4})
  with pytest.raises(UserError, match="config.model.num_heads=4 is not divisible by the mesh's "
                                      "tensor size 8"):
    sharding.check_divisible(config, {"runs": 1, "data": 1, "fsdp": 1, "tensor": 8})
  with pytest.raises(UserError, match="config.train.batch_size=4 is not divisible by the "
                                      "mesh's data x fsdp size 8"):
    sharding.check_divisible(config, {"runs": 1, "data": 4, "fsdp": 2, "tensor": 1})
  with pytest.raises(UserError, match="6 runs is not divisible by the mesh's runs size 4"):
    sharding.check_divisible(config, {"runs": 4, "data": 1, "fsdp": 1, "tensor": 1}, 6)


@pytest.mark.slow
def test_meshes_give_the_single_device_trajectory_and_checkpoints_move_between_them(tmp_path):
  # No other test compiles these 8-device programs: storing them in the shared compilation
  # cache would only cost (about 5% of this test).
  result = subprocess.run(
      [sys.executable, os.path.join(runs.REPO, "tests", "sharded_run.py"), str(tmp_path)],
      cwd=os.path.join(runs.REPO, "tests"), capture_output=True, text=True, timeout=runs.bound(600),
      env=dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false"))
  assert result.returncode == 0, result.stderr[-4000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  assert out["device_count"] == 8
  configs = {key.split("@")[0] for key in out["losses"]}
  # Every parameter layout a placement has is sharded: each placement's is among those tested.
  tested = {c.split("/")[0] for c in configs}
  assert tested == set(out["placements"]) and "pre_ln" in tested
  layouts = {name: parameter_layout(tiny_config(placement=name)) for name in placements.names()}
  for name in placements.names():
    assert layouts[name] in {layouts[t] for t in tested}, name
  assert {c.split("/")[1] for c in configs} == {"sinusoidal", "learned", "conv"}
  assert {key.split("@")[1] for key in out["losses"]} == {
      "single", "data8", "fsdp8", "tensor4", "d2f2t2"}
  for config in configs:
    reference = out["losses"][f"{config}@single"]
    assert reference[-1] < reference[0], config  # it trained
    meshes = [key.split("@")[1] for key in out["losses"] if key.startswith(f"{config}@")]
    assert "d2f2t2" in meshes, (config, meshes)
    for mesh in meshes:
      got = out["losses"][f"{config}@{mesh}"]
      for a, b in zip(got, reference):
        assert abs(a - b) <= 2e-4 * abs(b), (config, mesh, got, reference)
  # 8 runs of a sweep, one per device on the runs axis, follow the same trajectories as the 8
  # runs vmapped on one device.
  assert out["runs_sharding"].startswith("P('runs',")  # each device holds one run's state
  one, eight = out["runs_one_device"], out["runs_eight_devices"]
  assert len(set(one[-1])) == 8  # eight different runs
  for step_one, step_eight in zip(one, eight):
    for a, b in zip(step_eight, step_one):
      assert a == pytest.approx(b, rel=1e-5)
  assert out["restored_equal"]
  # The target mesh's layout: [runs, layers, embed, mlp].
  assert out["restored_sharding"] == "P('runs', None, 'fsdp', 'tensor')"


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_same_devices(tmp_path):
  args = ("--config=configs/lm.py:tiny", *runs.tiny_args(tmp_path / "tfds", 6, every=3),
          "--config.train.batch_size=8")
  flags = os.environ.get("XLA_FLAGS", "")
  env4 = {"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=4"}
  runs.run_module("normstudy.main", *args, f"--workdir={tmp_path / 'one'}",
                  env=dict(os.environ, **env4))
  port = _free_port()
  env2 = dict(os.environ, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=2")
  procs = [runs.start_module("normstudy.main", *args, f"--workdir={tmp_path / 'two'}",
                             f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                             f"--process_id={i}", env=env2) for i in range(2)]
  outputs = [p.communicate(timeout=runs.bound(300)) for p in procs]
  for p, (_, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  one, two = runs.records(tmp_path / "one"), runs.records(tmp_path / "two")
  assert [r["step"] for r in two] == list(range(1, 7))
  for a, b in zip(one, two):
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
  assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == ["3", "6"]
  assert "'data': 4" in outputs[0][1]  # 2 processes x 2 devices on the data axis


def test_a_tpu_vm_pod_started_by_the_launcher_joins_one_distributed_job(monkeypatch):
  """GKE sets TPU_WORKER_HOSTNAMES; on a TPU VM launch/tpu_pod.sh sets NORMSTUDY_TPU_POD=1 and
  JAX reads the workers from the metadata server (once: no initialize, each worker alone)."""
  import jax
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  for name in ("SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "NORMSTUDY_TPU_POD"):
    monkeypatch.delenv(name, raising=False)
  assert sharding.initialize_distributed() is False and calls == []
  monkeypatch.setenv("NORMSTUDY_TPU_POD", "1")
  assert sharding.initialize_distributed() is True and calls == [((), {})]
  monkeypatch.delenv("NORMSTUDY_TPU_POD")
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w0,w1")
  assert sharding.initialize_distributed() is True and len(calls) == 2


@pytest.mark.parametrize("cluster", ["GceTpuCluster", "GkeTpuCluster", "SlurmCluster"])
def test_any_cluster_jax_detects_joins_one_distributed_job(monkeypatch, cluster):
  """JAX's own detection (the registry jax.distributed.initialize() consults), stubbed to find
  each kind in turn: a TPU VM, a GKE slice, a SLURM job of 2 tasks (of 1 task: no job)."""
  import jax
  from jax._src.clusters import ClusterEnv
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  for name in ("SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "NORMSTUDY_TPU_POD"):
    monkeypatch.delenv(name, raising=False)
  kinds = {env.__name__: env for env in ClusterEnv._cluster_types}
  for env in kinds.values():
    monkeypatch.setattr(env, "is_env_present", classmethod(lambda cls: False))
  assert sharding.detected_cluster() is None and sharding.initialize_distributed() is False
  monkeypatch.setattr(kinds[cluster], "is_env_present", classmethod(lambda cls: True))
  monkeypatch.setattr(kinds[cluster], "get_process_count", classmethod(lambda cls: 2))
  assert sharding.detected_cluster() == cluster
  assert sharding.initialize_distributed() is True and calls == [((), {})]
  if cluster == "SlurmCluster":
    monkeypatch.setattr(kinds[cluster], "get_process_count", classmethod(lambda cls: 1))
    assert sharding.detected_cluster() is None


def test_the_devices_a_slurm_task_is_told_to_use_reach_jax(monkeypatch):
  """NORMSTUDY_LOCAL_DEVICE_IDS (devices named outright) becomes jax.distributed.initialize's
  local_device_ids (unset: SLURM's rule or JAX's default); a malformed value is one line."""
  import jax
  from normstudy.errors import UserError
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append(k))
  monkeypatch.setenv("SLURM_NTASKS", "2")
  monkeypatch.setenv("SLURM_STEP_NODELIST", "localhost")  # inside an srun step
  # The test process's compile cache stays as it is (a real job turns it off).
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR_SHARED", "1")
  monkeypatch.setenv("NORMSTUDY_LOCAL_DEVICE_IDS", "0,1,2,3")
  assert sharding.initialize_distributed() is True
  assert calls == [{"local_device_ids": [0, 1, 2, 3]}]
  monkeypatch.setenv("NORMSTUDY_LOCAL_DEVICE_IDS", "0,x")
  with pytest.raises(UserError) as e:
    sharding.initialize_distributed()
  assert str(e.value) == ("NORMSTUDY_LOCAL_DEVICE_IDS='0,x' is not allowed; allowed: distinct "
                          "device numbers >= 0, comma-separated (launch/slurm_gpu.sh sets it)")
