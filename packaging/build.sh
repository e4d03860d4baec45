#!/usr/bin/env bash
# Builds the LocalChat desktop bundle (PyInstaller onedir) and prints its size.
#
#   bash packaging/build.sh                       -> dist/LocalChat/localchat
#   bash packaging/build.sh --with-default-model  -> same, with SmolLM2's GGUF inside (offline all-in-one)
#   bash packaging/build.sh --untrimmed           -> dist/untrimmed/LocalChat (the "before trimming" size)
#
# Sets up .venv first (tools/bootstrap.sh with the `package` extra, which brings PyInstaller).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
}

spec_args=()
dist_dir=dist
for arg in "$@"; do
  case "$arg" in
    --with-default-model) spec_args+=(--with-default-model) ;;
    --untrimmed) spec_args+=(--untrimmed); dist_dir=dist/untrimmed ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build.sh: unknown option '$arg' (allowed: --with-default-model, --untrimmed)" >&2; exit 2 ;;
  esac
done

bash tools/bootstrap.sh package

started=$(date +%s)
# No --clean: PyInstaller's cache keeps the stripped copies of big libraries (libllvmlite)
# between builds, which saves most of a rebuild's time.
.venv/bin/python -m PyInstaller --noconfirm --log-level WARN \
  --distpath "$dist_dir" --workpath build/pyinstaller \
  packaging/localchat.spec -- "${spec_args[@]}"
finished=$(date +%s)

bundle="$dist_dir/LocalChat"
echo "Built $bundle in $((finished - started)) s"
echo "Bundle size: $(du -sh "$bundle" | cut -f1)"
echo "Run it:      $bundle/localchat"
