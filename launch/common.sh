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
