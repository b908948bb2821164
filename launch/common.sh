# Shared by the launch scripts: --dry-run printing, and errors as one line.
DRY_RUN=0

# run CMD...: print the command exactly as it would run (shell-quoted); execute unless --dry-run.
run() {
  printf '%q ' "$@" | sed 's/ $//'
  echo
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

die() {
  echo "error: $*" >&2
  exit 2
}

# need_value OPTION [VALUE ...]: an option that takes a value must have one (not the next option).
need_value() {
  if [ $# -lt 2 ] || [[ "$2" == --* ]]; then
    die "$1 needs a value (${1#--} ...); see --help"
  fi
}
