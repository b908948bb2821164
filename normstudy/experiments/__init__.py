"""Experiments: from a config file to trained runs (the grid of arms and axes, validation,
preflight, planning into programs, the learning-rate search and its runner, worker processes). Imports the engine,
the data, the core, the records and the errors."""
