"""Test setup: 8 simulated CPU devices, set before jax is first imported, and the data and
runs that tests in several files need, each built once per session of a worker.

Three kinds, one directory each: tests/unit (in-process, short: `pytest -q tests/unit` is the
inner loop), tests/parity (against transformers and sentence-transformers, in-process) and
tests/integration (command lines, runs, processes, GCS: every one of them `slow`, which
`pytest -q -m "not slow"` leaves out). A test that starts a process, runs a command or trains
more than a few dozen steps belongs in tests/integration. `pytest -q` runs everything, in
parallel workers (pytest-xdist). A session fixture is built in each worker by the first of its
tests that asks for it, so a narrower run builds only the ones its tests use.
"""

import os
import pathlib

# The suite by kind: tests/unit (in-process, short), tests/parity (against transformers and
# sentence-transformers), tests/integration (command lines, runs, GCS). A subject's tests of
# another kind sit in a file of their own (tests/unit/test_hf_unit.py beside
# tests/parity/test_hf.py); what they share (constants, batches, random parameters, corpora,
# fixtures used by name) lives in tests/helpers/, which every tier imports and no test file
# is. No unit file imports a module that loads torch or transformers (the helpers that need
# them import them inside the functions that use them, or are imported only by the parity
# and integration tiers), so `pytest tests/unit` never pays for their import.
from tests.helpers.xla_env import (  # noqa: E402 (imports no jax)
    COMPILATION_CACHE,
    COMPILATION_CACHE_DIR,
    COMPILATION_CACHE_LIMIT_BYTES,
    QUICK_COMPILES,
    compiled_programs_crowd_memory,
    memory_in_a_line,
    memory_maps,
    optimized_compiles,
    resident_bytes,
    xla_flags,
)

# Eight simulated devices, compiled for speed, with a compilation cache kept between runs
# (xla_env.py says why); the processes the tests start inherit QUICK_COMPILES and the cache
# and get the same flags from xla_env.subprocess_env.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags(8)).strip()
os.environ.update(QUICK_COMPILES)
for variable, value in COMPILATION_CACHE.items():
    os.environ.setdefault(variable, value)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import contextlib  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
from collections.abc import Callable  # noqa: E402

import filelock  # noqa: E402
import hypothesis  # noqa: E402
import jax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import pytest  # noqa: E402

from bertjax import cli  # noqa: E402
from bertjax import data as data_lib  # noqa: E402
from bertjax.engine import compilation_cache  # noqa: E402
from bertjax.engine import loop as engine_loop  # noqa: E402
from bertjax.engine.rundir import CORPUS_DIR, DATA_DIR  # noqa: E402
from bertjax.finetune import loop  # noqa: E402
from bertjax.finetune.settings import FinetuneSettings  # noqa: E402
from bertjax.pretrain import loop as pretrain_loop  # noqa: E402
from bertjax.pretrain.data import ensure_data  # noqa: E402
from bertjax.pretrain.settings import PretrainSettings  # noqa: E402
from configs import tiny  # noqa: E402
from tests.helpers import gcs_emulator  # noqa: E402
from tests.helpers.corpora import (  # noqa: E402
    ONE_LAYER,
    finetune_config,
    topic_task,
    topic_words,
    write_corpus,
)
from tests.helpers.trainer import short_run_config  # noqa: E402
from tests.helpers.xdist_schedule import (  # noqa: E402
    CrashTolerantFileScheduling,
    WorkerLastWords,
)

# Property tests draw the same examples on every run by default ("ci"), so that a failure
# reproduces on the next run and on another machine; the failing example is printed with the
# blob that replays it (@reproduce_failure). HYPOTHESIS_PROFILE=explore draws new examples
# each run and keeps what fails in .hypothesis/ to try first next time.
hypothesis.settings.register_profile(
    "ci", derandomize=True, print_blob=True, deadline=None, database=None
)
hypothesis.settings.register_profile("explore", print_blob=True, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The tests compile thousands of programs: fewer garbage collections while they are traced,
# as in the commands (bertjax/cli.py says why).
cli.collect_garbage_less_often()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Keeps the compilation cache's size bounded, before any worker uses it."""
    is_worker = hasattr(session.config, "workerinput")  # pytest-xdist's workers have it
    if not is_worker and os.environ["JAX_COMPILATION_CACHE_DIR"] == str(COMPILATION_CACHE_DIR):
        compilation_cache.prune(COMPILATION_CACHE_DIR, COMPILATION_CACHE_LIMIT_BYTES)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent under `-p no:xdist`
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (pyproject.toml's addopts) by a scheduler that finishes the run when a
    worker crashes, instead of hanging (tests/helpers/xdist_schedule.py)."""
    if config.getvalue("dist") == "loadfile":
        return CrashTolerantFileScheduling(config, log)
    return None


LAST_WORDS = WorkerLastWords()


@pytest.hookimpl(trylast=True)  # in a worker, after pytest's faulthandler plugin (its file)
def pytest_configure(config):
    """A worker that dies says why in its test's report (tests/helpers/xdist_schedule.py)."""
    LAST_WORDS.configure(config)


@pytest.hookimpl(tryfirst=True)  # before pytest's faulthandler plugin restores its own file
def pytest_unconfigure(config):
    LAST_WORDS.unconfigure()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hooks, absent under `-p no:xdist`
def pytest_configure_node(node):
    LAST_WORDS.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    LAST_WORDS.handle_crash(report)


# Each test's seconds (setup, call and teardown) in the last run that ran it, kept in pytest's
# cache directory (`pytest --cache-clear` forgets them).
DURATIONS_KEY = "bertjax/durations"


INTEGRATION = pathlib.Path(__file__).parent / "integration"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Every test under tests/integration is `slow` (the tier that starts processes, runs
    commands and trains), whether or not its file says so. Then the order: the slow tests
    first; within each group the files whose tests took longest in the last run first (file
    order where nothing is recorded: a fresh clone), each file's tests in their order.
    pytest-xdist gives a free worker the next whole file in this order (pyproject.toml's
    addopts), so the longest are spread over the workers first and the end is made of short
    files, and a module's fixtures are built by one worker only."""
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.slow)
    cache = getattr(config, "cache", None)  # None under `-p no:cacheprovider`
    durations = cache.get(DURATIONS_KEY, {}) if cache is not None else {}

    def group(item) -> tuple[bool, str]:
        return item.get_closest_marker("slow") is None, item.nodeid.split("::")[0]

    seconds: dict[tuple[bool, str], float] = {}
    first: dict[tuple[bool, str], int] = {}
    for index, item in enumerate(items):
        key = group(item)
        seconds[key] = seconds.get(key, 0.0) + durations.get(item.nodeid, 0.0)
        first.setdefault(key, index)
    items.sort(key=lambda item: (group(item)[0], -seconds[group(item)], first[group(item)]))


# The durations of this run's tests, summed over their phases as they are reported.
_RAN: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """pytest-xdist's controller (or the only process) is told of every test's phases."""
    _RAN[report.nodeid] = _RAN.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    """Records the durations of the tests that ran, beside those of the tests that did not."""
    cache = getattr(session.config, "cache", None)
    if hasattr(session.config, "workerinput") or cache is None or not _RAN:
        return
    recorded = cache.get(DURATIONS_KEY, {})
    recorded.update({nodeid: round(seconds, 2) for nodeid, seconds in _RAN.items()})
    cache.set(DURATIONS_KEY, recorded)


# The synthetic corpus's prepared data: what test_trainer_unit.py's short run was recorded on.
SYNTHETIC_SEQ_LEN = 64
SYNTHETIC_PREDICTIONS = 10
ORBAX_ARRAY_HANDLER = ocp.type_handlers.get_type_handler(jax.Array)  # before any override


@pytest.fixture
def optimized():
    """For a test that runs hundreds of steps, or checks what XLA's optimising rewrites make of
    a program: its programs compile optimised (xla_env.py)."""
    with optimized_compiles():
        yield


@pytest.fixture(scope="session", autouse=True)
def whole_shard_saves():
    """Orbax saves each array's shards whole in this process, instead of splitting a
    replicated shard among its replicas, each saving a slice: on a CPU there is no transfer to
    spread, and each slice is an operation dispatched per leaf and replica, which made a tiny
    model's save on 8 simulated devices slower by half. The values saved are the same. The
    processes the tests start (train.py, finetune.py) save with Orbax's defaults, as users'
    runs do, and test_checkpoint.py puts them back for its tests (`orbax_defaults`)."""
    with orbax_array_handler(ocp.type_handlers.ArrayHandler(use_replica_parallel=False)):
        yield


# This worker's resident memory when it started, or last dropped its compiled programs.
_RESIDENT_FLOOR = [resident_bytes()]


@pytest.fixture(autouse=True)
def release_compiled_programs_when_memory_asks(request):
    """Drops jax's compiled programs after a test once this worker holds half the memory
    mappings Linux allows, or has grown by xla_env.RESIDENT_GROWTH_BYTES since it last dropped
    them. Until then a worker keeps them from file to file, so that the functions files share
    are traced and compiled once (xla_env.py says why memory asks). The worker's memory after
    the test goes in its last words, for the report of a crash in the next one."""
    yield
    maps, resident = memory_maps(), resident_bytes()  # read once: this runs after every test
    if compiled_programs_crowd_memory(_RESIDENT_FLOOR[0], maps, resident):
        jax.clear_caches()
        # A program held only by cyclic garbage keeps its mappings until the collector frees
        # it, and the young threshold is high (cli.collect_garbage_less_often): free it now.
        gc.collect()
        maps, resident = memory_maps(), resident_bytes()
        _RESIDENT_FLOOR[0] = resident
    LAST_WORDS.note(f"after {request.node.nodeid}: {memory_in_a_line(maps, resident)}")


@pytest.fixture(scope="module")
def orbax_defaults():
    """Orbax's own jax.Array handler (replica-parallel saves) for a module's tests."""
    with orbax_array_handler(ORBAX_ARRAY_HANDLER):
        yield


@contextlib.contextmanager
def orbax_array_handler(handler):
    """Orbax saves and restores jax.Arrays with `handler` inside the block."""
    before = ocp.type_handlers.get_type_handler(jax.Array)
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    try:
        yield
    finally:
        ocp.type_handlers.register_type_handler(jax.Array, before, override=True)


@pytest.fixture(scope="session")
def synthetic_corpus(tmp_path_factory) -> pathlib.Path:
    """tests/helpers/corpora.py's corpus at its defaults: 200 documents of 8 topics."""
    return write_corpus(tmp_path_factory.mktemp("synthetic") / "corpus.txt")


@pytest.fixture(scope="session")
def synthetic_data(synthetic_corpus) -> pathlib.Path:
    """The synthetic corpus prepared once (tokenizer, train and eval splits) for every test
    that pretrains or reads batches of it: the trainer, fine-tuning's source run, inference."""
    out = synthetic_corpus.parent / "prepared"
    data_lib.prepare(
        [str(synthetic_corpus)],
        out,
        max_seq_length=SYNTHETIC_SEQ_LEN,
        max_predictions_per_seq=SYNTHETIC_PREDICTIONS,
        vocab_size=350,
        dupe_factor=3,
        eval_fraction=0.1,
        workers=1,
        seed=1,
        verbose=False,
    )
    return out


@pytest.fixture(scope="session")
def packed_data(tmp_path_factory):
    """(corpus, the synthetic corpus prepared packed in chunks into rows of 64, its manifest):
    the packed-document tests' and the ModernBERT pretraining tests' data."""
    root = tmp_path_factory.mktemp("packed")
    # Documents of four sentences: rows hold several of them.
    corpus = write_corpus(root / "corpus.txt", num_documents=300, sentences_per_document=4, seed=3)
    manifest = data_lib.prepare(
        [str(corpus)],
        root / "data",
        max_seq_length=64,
        max_predictions_per_seq=10,
        vocab_size=300,
        eval_fraction=0.1,
        workers=1,
        seed=7,
        chunk_mb=0.01,
        layout="packed",
        verbose=False,
    )
    return corpus, root / "data", manifest


@pytest.fixture(scope="session")
def pretrained_run(synthetic_data, synthetic_corpus, tmp_path_factory):
    """(work directory, each topic's words): a one-layer BERT pretrained for 6 steps on the
    synthetic data, the source that fine-tuning tests start from. Tests must not change it."""
    config = short_run_config(
        tiny, synthetic_data, steps=6, batch_size=16, warmup_steps=2, log_every=6, **ONE_LAYER
    )
    workdir = tmp_path_factory.mktemp("pretrained") / "run"
    pretrain_loop.train_and_evaluate(PretrainSettings.from_config(config), str(workdir))
    return workdir, topic_words(synthetic_corpus)


@pytest.fixture(scope="session")
def finetuned_run(pretrained_run, tmp_path_factory):
    """(root, two-seed summary, preempted summary, resumed summary): topic classification
    (corpora.LABELS) fine-tuned from `pretrained_run` with seeds 1 and 2 in one run
    (root/seeds), and seed 1 alone preempted at step 25 and resumed (root/alone); root holds
    the csv files."""
    init_from, topics = pretrained_run
    root = tmp_path_factory.mktemp("classification")
    fields = {
        **topic_task(root, topics, train=320, validation=64, test=12),
        "num_epochs": 4,
        "optimizer.learning_rate": 1e-3,
    }

    def finetune(config, workdir):
        return loop.finetune(FinetuneSettings.from_config(config), workdir)

    seeds = finetune(finetune_config(init_from, seeds=(1, 2), **fields), root / "seeds")
    original = engine_loop.PreemptionWatcher.should_stop
    engine_loop.PreemptionWatcher.should_stop = lambda self, step: step == 25
    try:
        preempted = finetune(finetune_config(init_from, **fields), root / "alone")
    finally:
        engine_loop.PreemptionWatcher.should_stop = original
    resumed = finetune(finetune_config(init_from, **fields), root / "alone")
    return root, seeds, preempted, resumed


@pytest.fixture(scope="session")
def shared_by_workers(tmp_path_factory, worker_id):
    """`shared_by_workers(name, make)`: what `make(directory)` returns (JSON), made once for
    the whole suite in an empty `directory`. pytest-xdist's workers share it: the first to ask
    makes it beside the workers' temporary directories, and the others wait for it and read
    it there."""

    def shared(name: str, make: Callable[[pathlib.Path], dict]) -> dict:
        if worker_id == "master":  # no pytest-xdist workers
            return make(tmp_path_factory.mktemp(name))
        root = tmp_path_factory.getbasetemp().parent
        made = root / f"{name}.json"
        with filelock.FileLock(f"{made}.lock"):
            if not made.is_file():
                (root / name).mkdir()
                made.write_text(json.dumps(make(root / name), default=float))
            return json.loads(made.read_text())

    return shared


@pytest.fixture(scope="session")
def demo_corpus(shared_by_workers) -> pathlib.Path:
    """The built-in demo corpus, built once, in the corpus cache of `demo_run`'s work
    directory (where a run with no data given looks for it before building it)."""

    def build(directory: pathlib.Path) -> dict:
        return {"path": str(data_lib.demo_corpus_path(directory / "run" / CORPUS_DIR))}

    return pathlib.Path(shared_by_workers("demo_corpus", build)["path"])


@pytest.fixture(scope="session")
def demo_run(demo_corpus, shared_by_workers):
    """(work directory, summary, config) of what `python train.py` runs, shortened to two
    steps: the tiny recipe with no data given, so the run takes the demo corpus (from its
    cache, `demo_corpus`) and prepares it into <workdir>/data, where the demo recipe's own
    test finds it. Run once for the whole suite; the summary comes back through JSON."""
    config = tiny.get_config()
    config.num_train_steps = 2
    config.optimizer.warmup_steps = 1
    config.eval_every_steps = config.checkpoint_every_steps = 2
    config.eval_batches = 1
    workdir = demo_corpus.parent.parent
    settings = PretrainSettings.from_config(config)

    def run(_) -> dict:
        return pretrain_loop.train_and_evaluate(settings, str(workdir))

    return workdir, shared_by_workers("demo_run", run), config


@pytest.fixture(scope="session")
def demo_data(demo_corpus, shared_by_workers, request) -> Callable[[str], pathlib.Path]:
    """`demo_data(recipe)`: the demo corpus prepared as `python train.py --config
    configs/<recipe>.py` prepares it when given no data (the same function, settings and
    seed), once for the whole suite; the tests that run a recipe on the demo corpus without
    testing its preparation pass it as --config.data.dir. configs/tiny.py's is the one the
    default run prepared (`demo_run`)."""

    def prepared(recipe: str) -> pathlib.Path:
        if recipe == "tiny":
            return request.getfixturevalue("demo_run")[0] / DATA_DIR
        settings = PretrainSettings.from_config(
            importlib.import_module(f"configs.{recipe}").get_config()
        )

        def make(directory: pathlib.Path) -> dict:
            (directory / CORPUS_DIR).symlink_to(demo_corpus.parent, target_is_directory=True)
            data_dir, _ = ensure_data(
                settings.data,
                directory,
                eval_batch_size=settings.run.micro_batch_size,
                seed=settings.run.seed,
            )
            return {"dir": str(data_dir)}

        return pathlib.Path(shared_by_workers(f"demo_data_{recipe}", make)["dir"])

    return prepared


@pytest.fixture(scope="session")
def gcs():
    """A GCS emulator on 127.0.0.1 for the session; `gcs.bucket()` makes an empty bucket.

    Every GCS client (gcsfs, tensorstore) in this process and its subprocesses talks to it.
    """
    emulator = gcs_emulator.Emulator()
    yield emulator
    emulator.stop()
