"""Shared pytest fixtures: the two packaged real models and a cached tiny-model factory.

Test tiers: every test that needs a real model (its file or the loaded model) gets it from a
fixture in REAL_MODEL_FIXTURES and is marked `slow` here, so `pytest -m "not slow"` is a fast tier
that loads no real model. Tests that only read a real model's vocabulary (tokenizer fixtures,
tiny models carrying a real tokenizer) stay in the fast tier.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

# Before numpy loads (in every worker): test processes share a small machine, where OpenBLAS's own
# threads only fight each other (numpy reference forward on SmolLM2 under load: 31 s -> 3.6 s).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# llama.cpp (llama-cpp-python: the tests' real OpenAI-compatible server, their quantizer and the
# tokenizer oracle; every child inherits this) is built with OpenMP, whose threads spin between
# graph nodes by default: measured on SmolLM2 with --n_threads 1, a 40-token prompt cost 4.8-6.9 s
# of CPU spinning and 0.29 s with passive waiting (the same tokens; only the waiting changes).
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
# No record cache (engine/kernels/record_cache.py) unless a test asks for one in its own tmp_path:
# a test run must not fill the user's cache directory with repacked copies of the 1.1 GB model,
# nor spend its disk writes on them.
os.environ["LOCALCHAT_RECORD_CACHE"] = "0"

import pytest

# Make `tests.tiny_models` importable however pytest was invoked (rootdir or tests/ as cwd).
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from engine.model_files import ModelNotInstalledError, default_model_path, gemma3_270m_path  # noqa: E402
from tests.llama_server import start_openai_server  # noqa: E402
from tests.requirements import EMBED_HOW, MODELS_HOW, PEER_HOW, QWEN_HOW, missing  # noqa: E402

# Bytecode is cached during test runs (pytest's assertion-rewritten test modules, the engine and app
# modules every worker and child process imports), whatever the environment says: with
# PYTHONDONTWRITEBYTECODE=1 (set on the shared dev machine) each xdist worker rewrote all test
# modules again on every run (collection 8.7 s -> 3.3 s of CPU per worker) and every `python -m
# engine` child compiled the engine from source. The caches are __pycache__ dirs (.gitignore).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# --- Parallel runs (pytest-xdist; `-n auto` is in pyproject's addopts) ---------------------------

MAX_WORKERS = 4  # each worker maps both models and JIT-loads the kernels: ~1.5 GB RSS at its peak


def pytest_xdist_auto_num_workers(config):
    """How many worker processes `-n auto` starts: one per core this process may use, at most
    MAX_WORKERS, and none when the run names test ids from a single file (starting a worker
    costs ~2 s, most of a one-file run, and `--dist loadfile` would give that file one worker
    anyway). PYTEST_XDIST_AUTO_NUM_WORKERS, when set, wins (xdist's own hook reads it)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    files = {arg.split("::", 1)[0] for arg in config.args}
    if len(files) == 1 and files.pop().endswith(".py"):
        return 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(MAX_WORKERS, usable or 1)


# --- Real models -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama arch, GPT-2 BPE, ChatML)."""
    try:
        return default_model_path()
    except ModelNotInstalledError as exc:
        missing(f"SmolLM2 ({exc})", MODELS_HOW)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """gemma-3-270m Q4_K_M (gemma3 arch, SentencePiece 262k vocab)."""
    try:
        return gemma3_270m_path()
    except ModelNotInstalledError as exc:
        missing(f"gemma-3-270m ({exc})", MODELS_HOW)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    """SmolLM2 loaded with a 512-token context, one per test module (tests may fill its caches)."""
    from engine.loader import load_model

    with load_model(smollm2_path, n_ctx=512) as lm:
        yield lm


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    """gemma3-270m loaded with a 512-token context, one per test module."""
    from engine.loader import load_model

    with load_model(gemma3_path, n_ctx=512) as lm:
        yield lm


@pytest.fixture(scope="session")
def quant_variants(smollm2_path) -> dict[str, Path]:
    """SmolLM2 requantized into each IQ/TQ/MXFP4 type by llama.cpp's quantizer, with llama.cpp's
    greedy reply next to each file (tools/make_quant_variants.py). Built once into a cache dir
    ($LOCALCHAT_QUANT_VARIANTS, else the user cache) and reused; needs llama-cpp-python."""
    import platformdirs

    from tools.make_quant_variants import build, llama_cpp_dir

    if llama_cpp_dir() is None:
        missing("llama-cpp-python (which builds the requantized files)", PEER_HOW)

    default = Path(platformdirs.user_cache_dir("localchat-tests")) / "quant-variants-v1"
    out = Path(os.environ.get("LOCALCHAT_QUANT_VARIANTS", default))
    return build(out, "smollm2", log=lambda line: None)


@pytest.fixture(scope="session")
def qwen_coder_path() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2 arch, Hermes tool-call template, 1.1 GB), cached
    by `python -m tools.fetch_qwen_coder` (not part of the default setup: skipped without it)."""
    from tools.fetch_qwen_coder import qwen_coder_target

    path = qwen_coder_target()
    if not path.is_file():
        missing(f"{path.name} in the user cache", QWEN_HOW)
    return path


@pytest.fixture(scope="session")
def qwen_coder(qwen_coder_path):
    """Qwen2.5-Coder-1.5B loaded once per session with a 2048-token context."""
    from engine.loader import load_model

    with load_model(qwen_coder_path, n_ctx=2048) as lm:
        yield lm


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2 F16 (bert arch, WordPiece, mean pooling): the default embedding model,
    converted at set-up by `python -m tools.make_embedding_model` into the models cache."""
    from engine.embedding import default_embedding_model_path

    try:
        return default_embedding_model_path()
    except ModelNotInstalledError as exc:
        missing(f"the default embedding model ({exc})", EMBED_HOW)


@pytest.fixture(scope="module")
def minilm(minilm_path):
    """The default embedding model loaded (engine.embedding.Embedder), one per test module."""
    from engine.embedding import Embedder

    with Embedder.load(minilm_path) as embedder:
        yield embedder


REAL_MODEL_FIXTURES = frozenset(
    {"smollm2_path", "gemma3_path", "smollm2", "gemma3", "qwen_coder_path", "qwen_coder"}
    | {"minilm_path", "minilm"}
)


def pytest_collection_modifyitems(config, items):
    """Mark `slow` every test that uses a real model, then put the heaviest files first."""
    for item in items:
        if uses_real_model(item):
            item.add_marker(pytest.mark.slow)
    _heaviest_files_first(config, items)


def uses_real_model(item) -> bool:
    """Whether a test asks for a real model through a fixture above: directly or through another
    fixture (`fixturenames` is the closure), or by name through a parameter that an indirect
    fixture resolves with `request.getfixturevalue(request.param)`."""
    if REAL_MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return any(isinstance(value, str) and value in REAL_MODEL_FIXTURES for value in params)


# --- The fast tier loads no model ------------------------------------------------------------------
# A test outside the `slow` tier that still ends up with a real model (a fixture looked up by a name
# the collection could not see, or app code that opens the packaged default model by itself) fails
# here, naming the model, instead of quietly making `-m "not slow"` minutes slower.


@functools.cache
def _real_model_files() -> frozenset[Path]:
    from tools.fetch_qwen_coder import qwen_coder_target

    files = set()
    for find in (default_model_path, gemma3_270m_path, qwen_coder_target):
        try:
            files.add(Path(find()).resolve())
        except (ModelNotInstalledError, OSError):
            continue
    return frozenset(files)


@pytest.fixture(autouse=True)
def _fast_tier_loads_no_model(request, monkeypatch):
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    import engine.loader

    real_files = _real_model_files()
    built: list[str] = []
    build_model = engine.loader.build_model

    def watched_build_model(gguf_file, *args, **kwargs):
        path = getattr(gguf_file, "path", None)
        if path is not None and Path(path).resolve() in real_files:
            built.append(Path(path).name)
        return build_model(gguf_file, *args, **kwargs)

    monkeypatch.setattr(engine.loader, "build_model", watched_build_model)
    yield
    fixtures = sorted(REAL_MODEL_FIXTURES.intersection(request.fixturenames))
    if fixtures or built:
        pytest.fail(
            "a fast-tier test (not marked slow) used a real model: "
            + ", ".join([f"fixture {name}" for name in fixtures] + [f"loaded {n}" for n in built])
            + "; ask for it through a fixture argument (conftest marks those slow)",
            pytrace=False,
        )


# --- Balancing `--dist loadfile` -----------------------------------------------------------------
# xdist hands whole files to the workers in collection order (pyproject passes
# --no-loadscope-reorder: its default order, most tests first, put the few-test real-model files
# last, where one ran alone for ~50 s while the other core idled). Longest first balances: each
# file's seconds in the last run, kept in pytest's cache (.pytest_cache) by the controller.

FILE_SECONDS_KEY = "localchat/file_seconds"
_file_seconds: dict[str, float] = {}
_READ_ONCE = pytest.StashKey[dict]()


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _heaviest_files_first(config, items) -> None:
    """Reorder whole files (tests inside a file keep their order) by their seconds in the last
    run, longest first; files with no record yet (a fresh checkout, a new file) go by how many
    real-model tests they have, then in collection order."""
    seconds = _recorded_file_seconds(config)
    first_seen: dict[str, int] = {}
    real_model_tests: dict[str, int] = {}
    for item in items:
        name = _file_of(item.nodeid)
        first_seen.setdefault(name, len(first_seen))
        if item.get_closest_marker("slow") is not None:
            real_model_tests[name] = real_model_tests.get(name, 0) + 1

    def weight(item) -> tuple:
        name = _file_of(item.nodeid)
        return (-seconds.get(name, 0.0), -real_model_tests.get(name, 0), first_seen[name])

    items.sort(key=weight)


def _recorded_file_seconds(config) -> dict[str, float]:
    """The last run's file seconds. A worker takes the controller's copy (pytest_configure_node):
    every worker must collect the same order, even if another run rewrites the cache meanwhile."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return workerinput.get(FILE_SECONDS_KEY, {})
    if _READ_ONCE not in config.stash:  # the controller reads once, for itself and every worker
        cache = getattr(config, "cache", None)
        config.stash[_READ_ONCE] = cache.get(FILE_SECONDS_KEY, {}) if cache is not None else {}
    return config.stash[_READ_ONCE]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist, in the controller) Hand each worker the file seconds the controller read."""
    node.workerinput[FILE_SECONDS_KEY] = _recorded_file_seconds(node.config)


def pytest_runtest_logreport(report):
    """Add every phase's duration to its file's total (in the controller, from all workers)."""
    name = _file_of(report.nodeid)
    _file_seconds[name] = _file_seconds.get(name, 0.0) + report.duration


def pytest_sessionfinish(session):
    """Record this run's file seconds for the next run's order (files not run keep theirs).
    Only the process that saw every report writes: the controller, or a run without workers."""
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _file_seconds:
        return
    recorded = dict(cache.get(FILE_SECONDS_KEY, {}))
    recorded.update({name: round(t, 2) for name, t in _file_seconds.items()})
    cache.set(FILE_SECONDS_KEY, recorded)


# --- Generated models --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """`make(arch, qtype=F32, seed=0, **dims) -> Path`: a tiny random GGUF, written once per session.

    Files are cached by their arguments, so tests asking for the same model share one file.
    """
    from tests.tiny_models import write_tiny_model

    directory = tmp_path_factory.mktemp("tiny_models")
    cache: dict[tuple, Path] = {}

    def make(arch: str, qtype=None, seed: int = 0, **kwargs) -> Path:
        from gguf import GGMLQuantizationType

        qtype = GGMLQuantizationType.F32 if qtype is None else GGMLQuantizationType(qtype)
        key = (arch, qtype, seed, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key not in cache:
            path = directory / f"tiny-{arch}-{qtype.name}-{seed}-{len(cache)}.gguf"
            cache[key] = write_tiny_model(path, arch, qtype, seed, **kwargs)
        return cache[key]

    return make


# --- a real OpenAI-compatible server (llama-cpp-python[server]) on loopback ----------------------
# (tests/llama_server.py starts it)
@pytest.fixture(scope="session")
def openai_server(smollm2_path, tmp_path_factory):
    """A real OpenAI-compatible server (llama-cpp-python) serving SmolLM2 as model 'smollm2'."""
    server = start_openai_server(smollm2_path, tmp_path_factory.mktemp("llama-server"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def openai_server_with_key(smollm2_path, tmp_path_factory):
    """The same server started with --api_key (for the wrong-key test)."""
    server = start_openai_server(
        smollm2_path, tmp_path_factory.mktemp("llama-server-key"), api_key="sk-test-correct-key"
    )
    yield server
    server.stop()


# --- our own server (`python -m engine serve`) on loopback -----------------------------------------
@pytest.fixture(scope="session")
def localchat_server(smollm2_path, tmp_path_factory):
    """`python -m engine serve` serving SmolLM2 (2048-token context, no key) for the app's remote
    client: the same requests as against llama-cpp-python, where the behaviour should match."""
    from tests.engine_server import running_server

    log = tmp_path_factory.mktemp("localchat-server") / "stderr.txt"
    with running_server(smollm2_path, log, "--n-ctx", "2048") as server:
        yield server


@pytest.fixture(params=["llama_cpp", "localchat"])
def any_openai_server(request, smollm2_path):
    """Each real OpenAI-compatible server in turn: llama-cpp-python, then our own."""
    name = "openai_server" if request.param == "llama_cpp" else "localchat_server"
    return request.getfixturevalue(name)
