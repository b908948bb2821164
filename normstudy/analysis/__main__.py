"""`python -m normstudy.analysis` is the same command as `python -m normstudy.analyze`."""

from normstudy import analyze
from normstudy import cli

if __name__ == "__main__":
  cli.run(analyze.main, analyze.define_flags)
