"""packaging/install-desktop-entry.sh puts a working LocalChat entry into the user's menu."""

import configparser
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = REPO / "packaging" / "install-desktop-entry.sh"
SHIPPED_ENTRY = REPO / "packaging" / "localchat.desktop"

ICON_SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" height="8"/></svg>'


def make_fake_bundle(parent: Path) -> Path:
    """The two things the installer reads from a bundle: the executable and the icon."""
    bundle = parent / "Local Chat & co" / "LocalChat"
    (bundle / "_internal" / "resources").mkdir(parents=True)
    (bundle / "_internal" / "resources" / "icon.svg").write_text(ICON_SVG)
    executable = bundle / "localchat"
    executable.write_text("#!/bin/sh\nexit 0\n")
    executable.chmod(0o755)
    return bundle


def run_installer(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    env = dict(os.environ, HOME=str(home), XDG_DATA_HOME=str(home / "share"))
    return subprocess.run(
        ["bash", str(INSTALL_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def read_entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # desktop-entry keys are case-sensitive
    parser.read(path)
    return parser["Desktop Entry"]


def test_shipped_entry_names_the_app_and_its_icon():
    entry = read_entry(SHIPPED_ENTRY)
    assert entry["Type"] == "Application"
    assert entry["Name"] == "LocalChat"
    assert entry["Exec"] == "localchat"
    assert entry["Icon"] == "localchat"
    assert entry["Terminal"] == "false"
    assert entry["StartupWMClass"] == "LocalChat"  # the app's X11 WM_CLASS class
    assert entry["Categories"].endswith(";")


def test_install_points_the_menu_entry_at_the_bundle(tmp_path):
    bundle = make_fake_bundle(tmp_path)
    result = run_installer(tmp_path, str(bundle), "--desktop")
    assert result.returncode == 0, result.stderr

    share = tmp_path / "home" / "share"
    entry = read_entry(share / "applications" / "localchat.desktop")
    executable = bundle / "localchat"
    assert entry["Exec"] == f'"{executable}"'
    assert entry["TryExec"] == str(executable)
    assert (
        share / "icons" / "hicolor" / "scalable" / "apps" / "localchat.svg"
    ).read_text() == ICON_SVG

    launcher = tmp_path / "home" / "Desktop" / "localchat.desktop"
    assert read_entry(launcher)["Exec"] == f'"{executable}"'
    assert launcher.stat().st_mode & stat.S_IXUSR


def test_installed_entry_passes_desktop_file_validate(tmp_path):
    validator = shutil.which("desktop-file-validate")
    if validator is None:
        pytest.skip("desktop-file-validate (desktop-file-utils) is not installed")
    bundle = make_fake_bundle(tmp_path)
    assert run_installer(tmp_path, str(bundle)).returncode == 0
    for path in (SHIPPED_ENTRY, tmp_path / "home" / "share" / "applications" / "localchat.desktop"):
        check = subprocess.run([validator, str(path)], capture_output=True, text=True)
        assert check.returncode == 0 and check.stdout == "", check.stdout + check.stderr


def test_uninstall_removes_entry_icon_and_launcher(tmp_path):
    bundle = make_fake_bundle(tmp_path)
    assert run_installer(tmp_path, str(bundle), "--desktop").returncode == 0
    assert run_installer(tmp_path, "--uninstall").returncode == 0
    home = tmp_path / "home"
    assert not (home / "share" / "applications" / "localchat.desktop").exists()
    assert not (
        home / "share" / "icons" / "hicolor" / "scalable" / "apps" / "localchat.svg"
    ).exists()
    assert not (home / "Desktop" / "localchat.desktop").exists()


def test_missing_bundle_is_refused_with_the_build_command(tmp_path):
    result = run_installer(tmp_path, str(tmp_path / "nowhere"))
    assert result.returncode == 1
    assert "packaging/build.sh" in result.stderr
    assert not (tmp_path / "home" / "share" / "applications" / "localchat.desktop").exists()


def test_path_needing_exec_escapes_is_refused(tmp_path):
    bundle = make_fake_bundle(tmp_path / "price$dollar")
    result = run_installer(tmp_path, str(bundle))
    assert result.returncode == 1
    assert "contains one of" in result.stderr
