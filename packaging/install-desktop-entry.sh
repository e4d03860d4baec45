#!/usr/bin/env bash
# Adds LocalChat to the application menu of the current user (no root needed).
#
#   bash packaging/install-desktop-entry.sh [BUNDLE_DIR] [--desktop] [--uninstall]
#
# BUNDLE_DIR is the built bundle (default: dist/LocalChat next to this checkout; any copy of it
# works, e.g. /opt/LocalChat). Installs
#   $XDG_DATA_HOME/applications/localchat.desktop  (Exec = the bundle's absolute path)
#   $XDG_DATA_HOME/icons/hicolor/scalable/apps/localchat.svg  (or 256x256/apps/localchat.png)
# with XDG_DATA_HOME defaulting to ~/.local/share.
# --desktop also puts a launcher on the desktop, marked trusted so that double-clicking it
#           starts LocalChat (GNOME otherwise asks to "Allow Launching" first).
# --uninstall removes what an earlier run installed.
set -euo pipefail

packaging_dir=$(cd "$(dirname "$0")" && pwd)
bundle_dir="$packaging_dir/../dist/LocalChat"
on_desktop=0
uninstall=0
for arg in "$@"; do
  case "$arg" in
    --desktop) on_desktop=1 ;;
    --uninstall) uninstall=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) echo "install-desktop-entry.sh: unknown option '$arg' (allowed: --desktop, --uninstall)" >&2; exit 2 ;;
    *) bundle_dir=$arg ;;
  esac
done

data_home=${XDG_DATA_HOME:-$HOME/.local/share}
applications_dir="$data_home/applications"
icons_dir="$data_home/icons/hicolor"
entry="$applications_dir/localchat.desktop"
desktop_dir=$(xdg-user-dir DESKTOP 2>/dev/null || echo "$HOME/Desktop")
desktop_launcher="$desktop_dir/localchat.desktop"

refresh_caches() {
  # Menus pick the entry up without these on most desktops; they only speed things up.
  if command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$applications_dir" || true
  fi
  if command -v gtk-update-icon-cache >/dev/null && [ -f "$icons_dir/index.theme" ]; then
    gtk-update-icon-cache -q -t "$icons_dir" || true
  fi
}

if [ "$uninstall" = 1 ]; then
  rm -f "$entry" "$desktop_launcher" \
    "$icons_dir/scalable/apps/localchat.svg" "$icons_dir/256x256/apps/localchat.png"
  refresh_caches
  echo "Removed the LocalChat menu entry, icon and desktop launcher."
  exit 0
fi

if [ ! -d "$bundle_dir" ]; then
  echo "install-desktop-entry.sh: no bundle at '$bundle_dir'; build it with 'bash packaging/build.sh'" >&2
  exit 1
fi
bundle_dir=$(cd "$bundle_dir" && pwd)
executable="$bundle_dir/localchat"
if [ ! -x "$executable" ]; then
  echo "install-desktop-entry.sh: '$executable' is missing or not executable; is '$bundle_dir' a LocalChat bundle?" >&2
  exit 1
fi
# Exec values are quoted below; inside quotes the desktop-entry spec needs double escaping for
# these characters. Rather than get that subtly wrong, refuse such paths.
case "$executable" in
  *'"'* | *'`'* | *'$'* | *'\'* | *'%'*)
    echo "install-desktop-entry.sh: the bundle path '$executable' contains one of \" \` \$ \\ %; move the bundle elsewhere" >&2
    exit 1 ;;
esac

# The app's icon as the bundle carries it (resources/ inside _internal/).
icon_src=""
for candidate in localchat.svg icon.svg localchat.png icon.png; do
  if [ -f "$bundle_dir/_internal/resources/$candidate" ]; then
    icon_src="$bundle_dir/_internal/resources/$candidate"
    break
  fi
done
if [ -z "$icon_src" ]; then
  echo "install-desktop-entry.sh: no icon (localchat.svg, icon.svg, localchat.png or icon.png) in $bundle_dir/_internal/resources" >&2
  exit 1
fi
case "$icon_src" in
  *.svg) icon_dest="$icons_dir/scalable/apps/localchat.svg" ;;
  *) icon_dest="$icons_dir/256x256/apps/localchat.png" ;;
esac
mkdir -p "$(dirname "$icon_dest")" "$applications_dir"
cp "$icon_src" "$icon_dest"

# The shipped entry, pointed at this bundle ('&' and '|' are special in a sed replacement).
executable_for_sed=${executable//&/\\&}
executable_for_sed=${executable_for_sed//|/\\|}
sed -e "s|^Exec=.*|Exec=\"$executable_for_sed\"|" -e "s|^TryExec=.*|TryExec=$executable_for_sed|" \
  "$packaging_dir/localchat.desktop" > "$entry"
chmod 644 "$entry"
refresh_caches
echo "Installed $entry"
echo "Installed $icon_dest"

if [ "$on_desktop" = 1 ]; then
  mkdir -p "$desktop_dir"
  cp "$entry" "$desktop_launcher"
  # Executable + trusted is what GNOME/Nautilus and most file managers require to launch a
  # .desktop file on double-click.
  chmod 755 "$desktop_launcher"
  if command -v gio >/dev/null; then
    gio set "$desktop_launcher" metadata::trusted true 2>/dev/null || true
  fi
  echo "Installed $desktop_launcher"
fi
echo "LocalChat is now in the application menu (search for 'LocalChat')."
