"""Run as `python -m tests.devices` by tests/test_fork_server.py: prints how many devices this
process's JAX backend has (what XLA_FLAGS gives it when the backend starts)."""

import jax

print(jax.device_count())
