# Replaces PyInstaller's own hook for PySide6.QtGui (a hook in a spec's hookspath wins): the same
# collection, minus the plugins packaging/qt_trim.py trims. Filtering here, before PyInstaller
# analyses the collected plugins' shared-library dependencies, keeps those dependencies (GTK and
# its stack for the GTK3 theme, libQt6Pdf for the PDF image format, EGLFS libraries...) out of
# the bundle; filtering only after the analysis would leave them behind.
import os

from PyInstaller.utils.hooks.qt import add_qt6_dependencies
from qt_trim import is_trimmed_path

hiddenimports, binaries, datas = add_qt6_dependencies(__file__)
binaries = [
    (src, dest_dir)
    for src, dest_dir in binaries
    if not is_trimmed_path(f"{dest_dir}/{os.path.basename(src)}")
]
