#!/usr/bin/env bash
# CI smoke test of the frozen app.
#
#   bash packaging/smoke_test.sh [--no-build] [--with-default-model]
#
# 1. Builds the bundle once (packaging/build.sh); --no-build reuses dist/LocalChat.
# 2. Copies it to a fresh directory and makes that read-only: `chmod -R a-w` plus a read-only
#    bind mount in a private mount namespace (unshare, as root or in a user namespace).
# 3. Runs `localchat --smoke PROMPT --model <SmolLM2 GGUF>` headless (QT_QPA_PLATFORM=offscreen)
#    with empty HOME/XDG dirs and no network (a new, empty network namespace, `unshare -n`),
#    twice: with a cold JIT cache, then warm. Each run must exit 0 and print a non-empty reply.
#    Also checks the JIT cache landed in the user cache dir and nothing was written to the bundle.
#    Where Xvfb is installed, also starts the GUI on it (xcb) and waits for the main window.
# 4. Prints the bundle size, the start-up times (process start to model ready) and the
#    start-to-exit times of both runs.
# --with-default-model builds the all-in-one bundle and runs it without --model instead.
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
build_args=()
with_model=0
for arg in "$@"; do
  case "$arg" in
    --no-build) build=0 ;;
    --with-default-model) with_model=1; build_args+=(--with-default-model) ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "smoke_test.sh: unknown option '$arg' (allowed: --no-build, --with-default-model)" >&2; exit 2 ;;
  esac
done

prompt=${LOCALCHAT_SMOKE_PROMPT:-"What is 2 + 2?"}
run_timeout=${LOCALCHAT_SMOKE_TIMEOUT:-600}

fail() { echo "SMOKE FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

if [ "$build" = 1 ]; then
  build_started=$(now)
  bash packaging/build.sh "${build_args[@]}"
  echo "smoke: build took $(elapsed "$build_started" "$(now)") s"
fi
[ -x dist/LocalChat/localchat ] || fail "no bundle at dist/LocalChat (run without --no-build)"

model_args=()
if [ "$with_model" = 1 ]; then
  [ -f "dist/LocalChat/_internal/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] \
    || fail "dist/LocalChat has no bundled model; build with --with-default-model"
  [ -f "dist/LocalChat/_internal/models/all-MiniLM-L6-v2.F16.gguf" ] \
    || fail "dist/LocalChat has no bundled embedding model; build with --with-default-model"
else
  model=$(.venv/bin/python -c 'from engine.model_files import default_model_path; print(default_model_path())')
  model_args=(--model "$model")
fi

work=$(mktemp -d /tmp/localchat-smoke.XXXXXX)
gui_pids=()  # the GUI check's app and Xvfb, if still running
cleanup() {
  for pid in "${gui_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The bundle as a user would have it in a read-only place (/opt, a mounted image...).
mkdir -p "$work/ro" "$work/home" "$work/cache" "$work/data" "$work/config" "$work/runtime"
chmod 700 "$work/runtime"
cp -a dist/LocalChat "$work/ro/"
chmod -R a-w "$work/ro/LocalChat"
bundle="$work/ro/LocalChat"
touch "$work/before-run"

# How each run is isolated: a new, empty network namespace and a read-only bind mount of the
# bundle in a private mount namespace; as root directly, otherwise inside a user namespace
# (unshare -r, where available). Note that chmod alone does not stop root, nor the mapped root
# of a user namespace, from writing: the check after the runs (no file in the bundle newer
# than the copy) backs every variant up.
ro_mount='mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"'
isolation="chmod -R a-w only (no namespaces available here); network left on"
wrap=()
if command -v unshare >/dev/null; then
  for namespaces in "-m -n" "-r -m -n"; do
    # shellcheck disable=SC2086  # word splitting of the option list is intended
    if unshare $namespaces sh -c "$ro_mount" "$bundle" true 2>/dev/null; then
      # shellcheck disable=SC2206
      wrap=(unshare $namespaces sh -c "$ro_mount" "$bundle")
      isolation="read-only bind mount, no network (unshare $namespaces)"
      break
    fi
  done
fi
echo "smoke: isolation: $isolation"

run_smoke() {  # $1 = label; prints the reply, sets last_seconds
  local label=$1 started out rc
  started=$(now)
  set +e
  out=$(env -i PATH=/usr/bin:/bin HOME="$work/home" XDG_CACHE_HOME="$work/cache" \
    XDG_DATA_HOME="$work/data" XDG_CONFIG_HOME="$work/config" XDG_RUNTIME_DIR="$work/runtime" \
    QT_QPA_PLATFORM=offscreen LANG=C.UTF-8 \
    timeout "$run_timeout" "${wrap[@]}" "$bundle/localchat" --smoke "$prompt" "${model_args[@]}" \
    2>"$work/$label.stderr")
  rc=$?
  set -e
  last_seconds=$(elapsed "$started" "$(now)")
  if [ "$rc" != 0 ]; then
    cat "$work/$label.stderr" >&2
    fail "$label run exited with $rc after $last_seconds s"
  fi
  if [ -z "$(printf '%s' "$out" | tr -d '[:space:]')" ]; then
    cat "$work/$label.stderr" >&2
    fail "$label run printed no reply"
  fi
  echo "smoke: $label run: exit 0 in $last_seconds s; reply: $out"
  # The app's own timing line goes to stderr: "[smoke] finish=.. tokens=N ttft_ms=T decode_tok_s=R".
  # Start-up (process start to model loaded, kernels compiled or taken from the cache) is the
  # wall time minus the generation itself: time to first token plus N-1 decode steps.
  local stats
  stats=$(grep '^\[smoke\]' "$work/$label.stderr" | tail -1 || true)
  last_startup=$(printf '%s\n' "$stats" | awk -v wall="$last_seconds" '{
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      if (v["ttft_ms"] == "" || v["decode_tok_s"] + 0 <= 0) { print "?"; exit }
      printf "%.1f", wall - v["ttft_ms"] / 1000 - (v["tokens"] - 1) / v["decode_tok_s"] }')
  echo "smoke: $label run: $stats; start-up ~$last_startup s"
}

run_smoke cold
cold_seconds=$last_seconds
cold_startup=$last_startup
# Signed cache entries (engine/kernels/compiler.py): <module>-<key>.jit, HMAC-checked before loading.
jit_objects=$(find "$work/cache" -path '*LocalChat*' -name '*.jit' | wc -l)
[ "$jit_objects" -gt 0 ] || fail "no JIT objects under XDG_CACHE_HOME after the cold run"
run_smoke warm
warm_seconds=$last_seconds
warm_startup=$last_startup

# The real window on a real X server (xcb platform plugin, the GUI's imports), where Xvfb is
# installed: the main window must appear within the timeout and the app must still be running.
gui_check() {
  if ! command -v Xvfb >/dev/null || ! command -v xwininfo >/dev/null; then
    echo "smoke: GUI check skipped (needs Xvfb and xwininfo)"
    return
  fi
  local display=":$((50 + RANDOM % 40))" xvfb_pid app_pid started shown=0
  Xvfb "$display" -screen 0 1280x800x24 -nolisten tcp >/dev/null 2>&1 &
  xvfb_pid=$!
  gui_pids+=("$xvfb_pid")
  for _ in $(seq 50); do
    [ -e "/tmp/.X11-unix/X${display#:}" ] && break
    sleep 0.1
  done
  started=$(now)
  env -i PATH=/usr/bin:/bin HOME="$work/home" XDG_CACHE_HOME="$work/cache" \
    XDG_DATA_HOME="$work/data" XDG_CONFIG_HOME="$work/config" XDG_RUNTIME_DIR="$work/runtime" \
    DISPLAY="$display" LANG=C.UTF-8 \
    "${wrap[@]}" "$bundle/localchat" "${model_args[@]}" >"$work/gui.stdout" 2>"$work/gui.stderr" &
  app_pid=$!
  gui_pids+=("$app_pid")
  for _ in $(seq 120); do
    kill -0 "$app_pid" 2>/dev/null || break
    # Qt sets WM_CLASS to ("localchat", "LocalChat"); the main window is the 1280x800 one.
    if xwininfo -display "$display" -root -tree 2>/dev/null | grep '"localchat" "LocalChat"' | grep -q '1280x800'; then
      shown=1
      break
    fi
    sleep 0.5
  done
  local alive=0
  kill -0 "$app_pid" 2>/dev/null && alive=1
  kill "$app_pid" "$xvfb_pid" 2>/dev/null || true
  wait "$app_pid" "$xvfb_pid" 2>/dev/null || true
  gui_pids=()
  if [ "$shown" != 1 ] || [ "$alive" != 1 ]; then
    cat "$work/gui.stderr" >&2
    fail "the GUI did not show its main window under Xvfb (xcb)"
  fi
  echo "smoke: GUI check: main window shown on Xvfb (xcb) after $(elapsed "$started" "$(now)") s"
}
gui_check

written=$(find "$bundle" -newer "$work/before-run" | head -5)
[ -z "$written" ] || fail "the app wrote into its bundle: $written"

echo "smoke: PASS"
# Test and development packages in a bundle are dead weight a user downloads (mypy once rode in
# through an optional import): none may be collected, whatever the build venv holds.
for dev_only in mypy mypyc pytest _pytest openai torch mutmut sentence_transformers pandas scipy; do
  if [ -e "dist/LocalChat/_internal/$dev_only" ] || compgen -G "dist/LocalChat/_internal/$dev_only.*" > /dev/null; then
    fail "the bundle carries the development-only package '$dev_only' (add it to NOT_RUNTIME_DEPENDENCIES in packaging/localchat.spec)"
  fi
done
echo "smoke: bundle size $(du -sh dist/LocalChat | cut -f1); JIT cache $(du -sh "$work/cache" | cut -f1) in $jit_objects objects"
echo "smoke: start-up (process start to model ready): cold JIT cache ~$cold_startup s, warm ~$warm_startup s"
echo "smoke: start-to-exit with a short greedy reply: cold JIT cache $cold_seconds s, warm $warm_seconds s"
