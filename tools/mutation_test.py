"""Mutation testing of the central pure-logic modules with mutmut, run by hand (not in CI).

    /work/main/.venv/bin/pip install -e '.[dev]'      # or: pip install 'mutmut>=3.8,<4'
    python tools/mutation_test.py                      # all modules (about an hour on 2 cores)
    python tools/mutation_test.py engine/stopping.py   # one module
    python tools/mutation_test.py --max-children 1 app/store.py

Each module is mutated in its own scratch copy of the working tree (under
$TMPDIR/localchat-mutation/<module>) so the checkout never holds a mutated file and each
module runs only its own fast test files (`-m "not slow"`: no real model is loaded per
mutant). The script prints one line per module, `killed/total (score%)`, then the names of
the surviving mutants; `cd` into the scratch copy and run `mutmut show NAME` to see a diff.
Surviving mutants that no test can kill (equivalent mutants) are listed with the reason in
tools/MUTATION.md; any other survivor is a missing test.

mutmut 3 copies the sources into `mutants/`, replaces every function with a trampoline that
picks the original or one mutant by an environment variable, records once which tests call
which function, then forks one process per mutant running only those tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The tool-call modules share their tests: the parsers on the templates' own call texts, each
# module piece by piece, and the request side (tools, tool_choice, prompt, grammar).
TOOL_CALL_TESTS = [
    "tests/test_tool_call_parsers.py",
    "tests/test_tool_call_units.py",
    "tests/test_tool_call_request.py",
]

# Module -> the fast test files that exercise it. Restricting each run to these keeps a mutant's
# test run to seconds; a mutant that only a slow end-to-end test could see counts as a survivor.
MODULE_TESTS = {
    "engine/sampling.py": ["tests/test_sampling.py"],
    "engine/stopping.py": ["tests/test_stopping.py"],
    "engine/presets.py": ["tests/test_presets.py", "tests/test_presets_chat_defaults.py"],
    "engine/detokenizer.py": ["tests/test_detokenizer.py"],
    "app/store.py": [
        "tests/test_app_store.py",
        "tests/test_app_store_behaviour.py",
        "tests/test_app_store_tree.py",
        "tests/test_app_import.py",
        "tests/test_app_long_chat.py",
    ],
    # Issue 31: the modules built last.
    "engine/receipt.py": ["tests/test_receipt.py", "tests/test_receipt_replay.py"],
    "engine/server/protocol.py": ["tests/test_server_protocol.py"],
    "engine/server/responses.py": [
        "tests/test_server_protocol.py",
        "tests/test_server_responses.py",
    ],
    "engine/batching/scheduler.py": ["tests/test_batching_scheduler.py"],
    "engine/batching/admission.py": [
        "tests/test_batching_admission.py",
        "tests/test_batching_scheduler.py",
    ],
    "engine/batching/forward_work.py": [
        "tests/test_batching_forward_work.py",
        "tests/test_batching_admission.py",
        "tests/test_batching_scheduler.py",
    ],
    "engine/tool_calls/hermes.py": TOOL_CALL_TESTS,
    "engine/tool_calls/mistral.py": TOOL_CALL_TESTS,
    "engine/tool_calls/json_scan.py": TOOL_CALL_TESTS,
    "engine/tool_calls/stream.py": TOOL_CALL_TESTS,
    "engine/tool_calls/call_body.py": TOOL_CALL_TESTS,
    "engine/tool_calls/items.py": TOOL_CALL_TESTS,
    "engine/tool_calls/spec.py": TOOL_CALL_TESTS,
    "engine/tool_calls/formats.py": TOOL_CALL_TESTS,
    "engine/tool_calls/json_lines.py": TOOL_CALL_TESTS,
    "engine/tool_calls/fallback.py": TOOL_CALL_TESTS,
    "engine/tool_calls/grammar.py": TOOL_CALL_TESTS,
    "app/backends/openai_client.py": ["tests/test_remote_client_branches.py"],
    "engine/repetition.py": ["tests/test_repetition.py"],
}

# tools: tests/conftest.py imports tools.fetch_qwen_coder (the fast-tier model guard)
COPIED = ("engine", "app", "tests", "tools", "resources", "pyproject.toml")


def scratch_copy(module: str, base: Path) -> Path:
    """A fresh copy of the working tree's sources and tests, with mutmut's config for `module`."""
    target = base / module.replace("/", "_").removesuffix(".py")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, target / name)
    tests = "\n    ".join(MODULE_TESTS[module])
    # mutmut reads [tool.mutmut] in pyproject.toml first, else [mutmut] in setup.cfg: the repo's
    # pyproject.toml has no such section, so each scratch copy gets its own setup.cfg.
    (target / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths =\n    engine\n    app\n"
        f"only_mutate =\n    {module}\n"
        # tests/conftest.py imports tools.fetch_qwen_coder; mutmut runs the tests in mutants/
        "also_copy =\n    tools\n"
        f"pytest_add_cli_args_test_selection =\n    {tests}\n"
        "pytest_add_cli_args =\n    -m\n    not slow\n    -p\n    no:cacheprovider\n"
        "    -o\n    addopts=\n"
    )
    return target


def mutmut(directory: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    # The tests must import the mutated copy, never the checkout the venv's editable install
    # points at, so no PYTHONPATH is passed down.
    env.pop("PYTHONPATH", None)
    command = [sys.executable, "-m", "mutmut", *args]
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)


def survivors_and_total(directory: Path) -> tuple[list[str], int]:
    listing = mutmut(directory, "results", "--all", "true").stdout
    rows = [line.strip() for line in listing.splitlines() if ": " in line]
    # A mutant that no mapped test reaches ("no tests") is not killed: it survives unseen.
    survived = [
        row.split(":", 1)[0]
        for row in rows
        if row.endswith(": survived") or row.endswith(": no tests")
    ]
    scored = [row for row in rows if not row.endswith(": skipped")]
    return survived, len(scored)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULE_TESTS)} (all)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants run at once")
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path(tempfile.gettempdir()) / "localchat-mutation",
        help="where the per-module copies go",
    )
    args = parser.parse_args(argv)
    modules = args.modules or list(MODULE_TESTS)
    unknown = sorted(set(modules) - set(MODULE_TESTS))
    if unknown:
        parser.error(f"no test files known for {', '.join(unknown)}")
    failed = False
    for module in modules:
        directory = scratch_copy(module, args.scratch)
        run = mutmut(directory, "run", "--max-children", str(args.max_children))
        (directory / "mutmut-run.log").write_text(run.stdout + run.stderr)
        if run.returncode != 0:
            print(f"{module}: mutmut failed, see {directory / 'mutmut-run.log'}")
            failed = True
            continue
        survived, total = survivors_and_total(directory)
        killed = total - len(survived)
        score = 100 * killed / total if total else 100.0
        print(f"{module}: {killed}/{total} killed ({score:.1f}%), scratch copy {directory}")
        for name in survived:
            print(f"    survived: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
