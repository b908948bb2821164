"""The numbers the README and docs quote are the numbers their commands wrote.

Every table of results in README.md and docs/*.md is preceded by a comment naming the committed
CSV it quotes and, per column after the first, a template of that CSV's columns:

  <!-- numbers: docs/survival/survival.csv | {failed} | {critical_lr:.3f} (...) | * -->

A row whose first cell starts with an arm id in backticks (`pre_norm_clip1`) is that CSV's row
(its `arm` column, or `run` for a study's summary); each cell must be its template filled from
that row (`*`: free text, not checked; a template ending in `*`: the cell starts with it; the
format `lr` writes a learning rate as the docs do, 3e-3). Bold marks are ignored."""

import csv
import os
import re
import string
import urllib.parse

import runs
from normstudy.analysis import stats

DOCS = ["README.md"] + [os.path.join("docs", name) for name in sorted(
    os.listdir(os.path.join(runs.REPO, "docs"))) if name.endswith(".md")]
MARKER = re.compile(r"<!-- numbers: (\S+) \|(.*?)-->", re.S)


class _Formatter(string.Formatter):
  def format_field(self, value, format_spec):
    if format_spec == "lr":
      mantissa, exponent = f"{float(value):.0e}".split("e")
      return mantissa if int(exponent) == 0 else f"{mantissa}e{int(exponent)}"
    if format_spec and value != "":
      value = float(value) if "." in str(value) or "e" in str(value) else int(value)
    return super().format_field(value, format_spec)


def _csv_rows(path):
  with open(os.path.join(runs.REPO, path), encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  key = "arm" if "arm" in rows[0] else "run"
  return {row[key]: row for row in rows}


def _tables(text):
  """(csv path, column templates, [row cells]) of every marked table."""
  for match in MARKER.finditer(text):
    templates = [t.strip() for t in match.group(2).split("|") if t.strip()]
    lines = text[match.end():].lstrip("\n").split("\n")
    body = []
    for line in lines:
      if not line.startswith("|"):
        break
      body.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    yield match.group(1), templates, body[2:]  # past the header and the rule


def test_every_quoted_table_matches_its_csv():
  formatter = _Formatter()
  checked = 0
  for doc in DOCS:
    text = open(os.path.join(runs.REPO, doc), encoding="utf-8").read()
    for path, templates, rows in _tables(text):
      source = _csv_rows(path)
      in_table = 0
      for cells in rows:
        arm = re.match(r"`([^`]+)`", cells[0])
        if not arm:
          continue
        assert arm.group(1) in source, f"{doc}: {arm.group(1)} is not a row of {path}"
        assert len(cells) == len(templates) + 1, f"{doc}: {cells} has other columns than {path}"
        for template, cell in zip(templates, cells[1:]):
          cell = cell.replace("**", "")
          if template == "*":
            continue
          if template.endswith("*"):
            expected = formatter.format(template[:-1], **source[arm.group(1)])
            assert cell.startswith(expected), (doc, arm.group(1), cell, expected)
          else:
            expected = formatter.format(template, **source[arm.group(1)])
            assert cell == expected, (doc, arm.group(1), cell, expected)
        in_table += 1
      assert in_table, f"{doc}: the table quoting {path} has no row naming an arm"
      checked += in_table
  assert checked >= 30  # the results tables: seed figure, survival, depth, speed, ...


def test_the_readme_is_a_front_page_and_usage_holds_the_rest():
  """Issue 87: the README is a front page (at most 25 KB, no line over 400 characters: what it
  is, the two commands, the answer in one table and one figure, where to go next);
  docs/usage.md holds the commands, reliability, configuration and clusters."""
  text = open(os.path.join(runs.REPO, "README.md"), encoding="utf-8").read()
  assert len(text.encode("utf-8")) <= 25 * 1024, len(text.encode("utf-8"))
  assert max(len(l) for l in text.splitlines()) <= 400
  headings = [l for l in text.splitlines() if l.startswith("## ")]
  assert headings == ["## Quick start", "## The seed figure, in miniature", "## The answer",
                      "## Where to go next"], headings
  assert "make study" in text and "make test" in text and "![Training Loss Comparison]" in text
  answer = text[text.index("## The answer"):text.index("## Where to go next")]
  assert answer.count("\n| ") >= 8  # one table, a row per question
  lines = open(os.path.join(runs.REPO, "docs", "usage.md"), encoding="utf-8").read().splitlines()
  # Its reliability section tables what each kind of bad input or event gets.
  section = "\n".join(lines[lines.index("## Reliability"):])
  section = section[:section.index("\n## ", 1)]
  rows = [l for l in section.splitlines() if l.startswith("| ") and not l.startswith("| ---")]
  assert rows[0] == "| input or event | what it gets |" and len(rows) >= 12, rows
  # Every file the docs link to exists.
  for doc in DOCS:
    text = open(os.path.join(runs.REPO, doc), encoding="utf-8").read()
    base = os.path.dirname(os.path.join(runs.REPO, doc))
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
      if not re.match(r"[a-z]+://", target):
        assert os.path.exists(os.path.join(base, target)), f"{doc} links to a missing {target}"


FIELDS_MARKER = re.compile(r"<!-- fields: (\w+) -->\n((?:\|.*\n)+)")


def test_the_configuration_tables_are_the_declarations():
  """docs/reference.md's configuration tables equal what normstudy.core.config declares, each
  field once (regenerate a table with config.reference_table(section))."""
  from normstudy.core import config as config_lib
  text = open(os.path.join(runs.REPO, "docs", "reference.md"), encoding="utf-8").read()
  documented = []
  for match in FIELDS_MARKER.finditer(text):
    section = "" if match.group(1) == "label" else match.group(1)
    expected = config_lib.reference_table(section)
    assert match.group(2).rstrip("\n") == expected, (
        f"docs/reference.md's table of {match.group(1)} differs from the declarations; it is:\n"
        f"{expected}")
    documented += re.findall(r"^\| `([\w.]+)` \|", match.group(2), re.M)
  assert sorted(documented) == sorted(f.name for f in config_lib.FIELDS)


# A number in prose quoted from a CSV carries a comment right after it naming where it comes
# from: `0.40<!-- n: docs/survival/critical_lr.csv arm=pre_norm_clip1 critical_lr .2f -->` (the
# row: key=value pairs joined by `&`, a value percent-encoded where it holds a space or `&`; the
# format: a Python format spec, `lr` as in the tables, `x` for a ratio written with two
# significant digits and a trailing x, `ix` for its inverse (1/value: a ratio quoted the other
# way round), `dx` for a difference of log10 values written as that
# ratio (10^value), `p` for a p-value as the analysis writes it with the exponent short: 0.013,
# 1.6e-4).
QUOTED = re.compile(r"(?P<number>[-+]?[\d.]+(?:e[-+]?\d+)?)x?\**\s?<!-- n: (?P<path>\S+) "
                    r"(?P<row>\S+) (?P<column>\S+) (?P<format>\S+) -->")


def _quoted_numbers(text):
  for match in QUOTED.finditer(text):
    yield match.group("number"), match.group("path"), match.group("row"), \
        match.group("column"), match.group("format")


def _cell(path, selector, column):
  with open(os.path.join(runs.REPO, path), encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  wanted = {key: urllib.parse.unquote(value)
            for key, value in (part.split("=", 1) for part in selector.split("&"))}
  found = [row for row in rows if all(row.get(k) == v for k, v in wanted.items())]
  assert len(found) == 1, f"{path}: {selector} selects {len(found)} rows"
  return found[0][column]


def test_every_number_quoted_in_prose_is_its_csvs():
  formatter = _Formatter()
  checked = 0
  for doc in DOCS:
    text = open(os.path.join(runs.REPO, doc), encoding="utf-8").read()
    for number, path, selector, column, spec in _quoted_numbers(text):
      checked += 1
      value = _cell(path, selector, column)
      if spec == "x":
        expected = f"{float(value):.2g}"
      elif spec == "ix":
        expected = f"{1 / float(value):.2g}"
      elif spec == "dx":
        expected = f"{10 ** float(value):.2g}"
      elif spec == "p":
        expected = re.sub(r"e([-+])0*(\d)", r"e\1\2", stats.format_p(float(value)))
        expected = expected.replace("e+", "e")
      else:
        expected = formatter.format("{value:" + spec + "}", value=value)
      assert number == expected, (doc, path, selector, column, number, expected)
  assert checked >= 50  # the survival and depth claims of README.md and docs/results.md


def test_timing_history_is_one_table_and_the_guides_name_no_dates():
  """Timings of sittings live in benchmarks/history.csv (date, commit, cpu, what, seconds);
  docs/development.md and docs/throughput.md are guides and name no date."""
  path = os.path.join(runs.REPO, "benchmarks", "history.csv")
  with open(path, encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  assert rows and list(rows[0]) == ["date", "commit", "cpu", "what", "seconds"]
  for row in rows:
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", row["date"]), row
    assert re.fullmatch(r"[0-9a-f]{7}|", row["commit"]), row
    assert row["what"] and float(row["seconds"]) > 0, row
  for name in ("development.md", "throughput.md"):
    text = open(os.path.join(runs.REPO, "docs", name), encoding="utf-8").read()
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text), name


def test_the_own_text_example_says_how_long_it_trains_and_how_to_shorten_it():
  """Issue 78, item 20: the own-text command (docs/usage.md) trained 1000 steps (about 9 minutes on 2
  cores) without saying so. Its sentence names the steps the config trains, the time, and the
  override that shortens it."""
  from configs import shakespeare
  text = open(os.path.join(runs.REPO, "docs", "usage.md"), encoding="utf-8").read()
  line = next(l for l in text.splitlines() if l.startswith("**Your own text**"))
  steps = shakespeare.get_config("pre_norm_clip1").train.num_steps
  assert f"{steps} steps" in line and "minutes" in line
  assert re.search(r"--config\.train\.num_steps=\d+", line)


# A sentence that says which pairs of a tests CSV are separated is that CSV's, generated:
# `<!-- pairs: docs/seed_figure/speed_tests.csv -->...<!-- /pairs -->` holds exactly
# normstudy.analysis.speed.separations of the committed file.
PAIRS = re.compile(r"<!-- pairs: (\S+) -->(.*?)<!-- /pairs -->", re.S)


def test_every_sentence_of_separated_pairs_is_its_csvs():
  """Issue 78, item 18: under the seed figure the README said "the rest not separated" while
  docs/seed_figure_tests.csv separated DeepNorm from attention relax. Every such sentence is
  now marked and must equal what its CSV says; and no "not separated" claim about the seed
  figure's pairs stands outside a marked sentence."""
  import pandas as pd
  from normstudy.analysis import speed
  checked = 0
  for doc in DOCS:
    text = open(os.path.join(runs.REPO, doc), encoding="utf-8").read()
    for path, sentence in PAIRS.findall(text):
      pairs = pd.read_csv(os.path.join(runs.REPO, path))
      assert sentence == speed.separations(pairs), (doc, path, speed.separations(pairs))
      checked += 1
  assert checked >= 1
  readme = open(os.path.join(runs.REPO, "README.md"), encoding="utf-8").read()
  figure = readme[readme.index("## The seed figure"):readme.index("## The answer")]
  assert "not separated" not in PAIRS.sub("", figure), "an unmarked 'not separated' claim"
  # The generated sentence against a plain transcription of the CSV's separated column.
  rows = list(csv.DictReader(open(os.path.join(runs.REPO, "docs/seed_figure/speed_tests.csv"))))
  separated = [r for r in rows if r["separated"] == "True"]
  sentence = PAIRS.search(figure).group(2)
  assert sentence.count("ends below") == len(separated)
  assert f"the other {len(rows) - len(separated)} pairs not separated" in sentence


def test_the_quick_start_says_where_things_go_outside_the_workdir():
  """Issue 88, item 20: what is written outside the workdir (684 MB of .tpu-aot among it),
  `make test-fast` and the notebook were not on the first page."""
  text = open(os.path.join(runs.REPO, "README.md"), encoding="utf-8").read()
  quick = text[text.index("## Quick start"):text.index("## The seed figure")]
  for named in ("make test-fast", ".tpu-aot/", "~/tensorflow_datasets", "~/.cache/normstudy/",
                "notebooks/compare_runs.ipynb"):
    assert named in quick, named
  from normstudy import cli
  cache = cli.COMPILE_CACHE_ENV["JAX_COMPILATION_CACHE_DIR"]
  if not os.environ.get("XDG_CACHE_HOME"):
    assert cache.startswith(os.path.expanduser("~/.cache/normstudy/"))
  makefile = open(os.path.join(runs.REPO, "Makefile"), encoding="utf-8").read()
  assert "TPU_AOT := .tpu-aot/" in makefile and "test-fast:" in makefile


def test_the_placement_table_is_the_registry():
  """Issue 87: docs/reference.md's placement table was written by hand and could drift from
  the registered placements. It is normstudy.core.placements.markdown_table() below its marker,
  one row per registered placement (its name, block, final norm and paper)."""
  from normstudy.core import placements
  text = open(os.path.join(runs.REPO, "docs", "reference.md"), encoding="utf-8").read()
  marker = "<!-- generated: normstudy.core.placements.markdown_table() -->\n"
  assert marker in text
  table = placements.markdown_table()
  found = text[text.index(marker) + len(marker):].split("\n\n")[0]
  assert found == table, ("regenerate: python -c 'from normstudy.core import placements; "
                          "print(placements.markdown_table())'")
  rows = [line for line in found.splitlines()[2:]]
  assert [re.match(r"\| `([a-z_]+)` \|", row).group(1) for row in rows] == [
      p.name for p in placements.REGISTRY.registered()]
  assert sorted(p.name for p in placements.REGISTRY.registered()) == list(placements.names())
  for row, placement in zip(rows, placements.REGISTRY.registered()):
    assert row.endswith(f" | {'yes' if placement.final_norm else 'no'} | {placement.paper} |")
    assert placement.paper and placement.description


def test_the_parametrization_table_is_the_registry():
  """Issue 87: parametrizations are registered objects with properties, as placements are; the
  docs' table of them is normstudy.core.parametrizations.markdown_table() below its marker, one
  row per registered parametrization in the order registered, the first the config's default."""
  from normstudy.core import config as config_lib
  from normstudy.core import parametrizations
  text = open(os.path.join(runs.REPO, "docs", "reference.md"), encoding="utf-8").read()
  marker = "<!-- generated: normstudy.core.parametrizations.markdown_table() -->\n"
  assert marker in text
  found = text[text.index(marker) + len(marker):].split("\n\n")[0]
  assert found == parametrizations.markdown_table(), (
      "regenerate: python -c 'from normstudy.core import parametrizations; "
      "print(parametrizations.markdown_table())'")
  registered = parametrizations.REGISTRY.registered()
  names = [re.match(r"\| `([a-z]+)`", row).group(1) for row in found.splitlines()[2:]]
  assert names == [p.name for p in registered] == list(parametrizations.NAMES)
  default = next(f.default for f in config_lib.FIELDS if f.name == "model.parametrization")
  assert found.splitlines()[2].startswith(f"| `{default}` (default) |")
  for row, p in zip(found.splitlines()[2:], registered):
    assert p.changes in row and row.endswith(f" | {p.base_shape} |")
