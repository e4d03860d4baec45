"""Which Qt files the LocalChat bundle leaves out: plugins and libraries the app never loads.

Shared by packaging/localchat.spec (which filters the analysed file list) and
packaging/pyinstaller_hooks/hook-PySide6.QtGui.py (which filters the QtGui plugins before
PyInstaller analyses their shared-library dependencies, so a dropped plugin's dependencies,
e.g. GTK for the GTK3 theme, never get collected in the first place).
Patterns are fnmatch patterns on the path inside the bundle.
"""

import fnmatch
import posixpath

QT = "PySide6/Qt"
TRIM_PATTERNS = [
    # Platform plugins for kiosk/embedded/remote setups; we keep xcb, wayland, offscreen, minimal.
    f"{QT}/plugins/platforms/libqeglfs.so",
    f"{QT}/plugins/platforms/libqminimalegl.so",
    f"{QT}/plugins/platforms/libqlinuxfb.so",
    f"{QT}/plugins/platforms/libqvnc.so",
    f"{QT}/plugins/platforms/libqvkkhrdisplay.so",
    f"{QT}/plugins/egldeviceintegrations/*",
    f"{QT}/lib/libQt6EglFSDeviceIntegration.so*",
    f"{QT}/lib/libQt6EglFsKmsSupport.so*",
    f"{QT}/lib/libQt6EglFsKmsGbmSupport.so*",
    # Touch input devices (evdev/tuio) for kiosk setups.
    f"{QT}/plugins/generic/*",
    # Image formats: PNG is built into QtGui, the icon is SVG; the rest is unused. qpdf alone
    # pulls in libQt6Pdf.
    f"{QT}/plugins/imageformats/libqgif.so",
    f"{QT}/plugins/imageformats/libqicns.so",
    f"{QT}/plugins/imageformats/libqico.so",
    f"{QT}/plugins/imageformats/libqjpeg.so",
    f"{QT}/plugins/imageformats/libqpdf.so",
    f"{QT}/plugins/imageformats/libqtga.so",
    f"{QT}/plugins/imageformats/libqtiff.so",
    f"{QT}/plugins/imageformats/libqwbmp.so",
    f"{QT}/plugins/imageformats/libqwebp.so",
    f"{QT}/lib/libQt6Pdf.so*",
    # QML/Quick: nothing in the app uses them.
    f"{QT}/lib/libQt6Qml*.so*",
    f"{QT}/lib/libQt6Quick*.so*",
    f"{QT}/lib/libQt6LabsStyleKit.so*",
    f"{QT}/plugins/qmltooling/*",
    f"{QT}/plugins/qmllint/*",
    f"{QT}/qml/*",
    # QtNetwork's plugins and library (see TRIMMED_MODULES).
    f"{QT}/plugins/networkinformation/*",
    f"{QT}/plugins/tls/*",
    f"{QT}/lib/libQt6Network.so*",
    # The GTK3 platform theme links GTK, and PyInstaller would bundle GTK with all of its
    # dependencies (cairo, pango, atk, krb5...) on a build machine that has GTK: large, and
    # liable to clash with the user's own GTK. The xdg-desktop-portal theme stays, which gives
    # native file dialogs on GNOME and KDE over D-Bus.
    f"{QT}/plugins/platformthemes/libqgtk3.so",
    # Translations of Qt Assistant/QtHelp, which the app does not use (qtbase_*.qm stay).
    f"{QT}/translations/qt_help_*.qm",
]


def is_trimmed_path(path_in_bundle: str) -> bool:
    path = path_in_bundle.replace("\\", "/")
    return any(fnmatch.fnmatch(path, pattern) for pattern in TRIM_PATTERNS)


def is_trimmed_entry(dest_name: str, src_name: str, typecode: str) -> bool:
    """For a PyInstaller TOC entry (dest_name, src_name, typecode)."""
    dest = dest_name.replace("\\", "/")
    if typecode == "SYMLINK":
        # PyInstaller links shared libraries into the top directory; a link's target (src_name)
        # is relative to the link's own directory. Drop links whose target is trimmed.
        dest = posixpath.normpath(
            posixpath.join(posixpath.dirname(dest), src_name.replace("\\", "/"))
        )
    return is_trimmed_path(dest)
