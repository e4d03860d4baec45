#!/usr/bin/env bash
# Screenshots of the main window's states, taken from a real X server (Xvfb) with the xcb platform.
#
#   bash tools/screenshot.sh [real|fake] [OUT_DIR] [all|explore|compare]
#
# real (default): replies from the real engine and the embedded SmolLM2; fake: scripted replies
# (tests/app_fakes.py). PNGs go to OUT_DIR (default resources/screenshots/). Installs Xvfb and the
# xcb libraries with apt-get the first time if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE="${1:-real}"
OUT="${2:-resources/screenshots}"
PY=.venv/bin/python

if ! command -v Xvfb >/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends xvfb xauth libxcb-icccm4 libxcb-keysyms1 \
        libxcb-cursor0 libxkbcommon-x11-0 libegl1 libgl1 libfontconfig1 libdbus-1-3 fonts-dejavu-core
fi

DISPLAY_NUM=":$((90 + RANDOM % 9))"
Xvfb "$DISPLAY_NUM" -screen 0 1280x800x24 -nolisten tcp >/dev/null 2>&1 &
XVFB_PID=$!
trap 'kill "$XVFB_PID" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    [ -e "/tmp/.X11-unix/X${DISPLAY_NUM#:}" ] && break
    sleep 0.1
done

DISPLAY="$DISPLAY_NUM" QT_QPA_PLATFORM=xcb "$PY" -m tools.demo "$OUT" --engine "$ENGINE" ${3:+--only "$3"}
echo "screenshots in $OUT"
