"""Records: everything a run, study or sweep writes and its names (the schema of run.json,
sweep.json and study.json, metrics.jsonl and its keys, run directories, point names, gs://
storage). Imports only normstudy.errors: the engine writes these files and the analysis reads
them through the same definitions."""
