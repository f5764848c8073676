"""pytest-xdist's file scheduling (`--dist loadfile`), made to finish after a worker crashes.

A worker that dies in native code (a segfault, an abort) is replaced, and its unfinished test
file goes back on the queue. pytest-xdist 3.8's `LoadFileScheduling` then hangs the run
forever with every worker idle (pytest-xdist issues #784, #1323, #1327, #1378):
- it puts back every file the dead worker was given, finished ones too, and a finished file
  is sent as an empty list of tests, which never reports back, so nothing schedules again;
- it puts back the test that crashed, so the replacement runs it again and may crash too;
- a worker runs a test only once it knows the next one (for teardown) or is told to stop,
  and a replacement worker may be given one file with one test left, then nothing more.

`CrashTolerantFileScheduling` fixes the three (and a fourth, which xdist shares: a report of
a worker's last test can arrive after the worker died, and sending it more work then raised an
internal error that ended the run): the crashed test counts as done (xdist has
reported it failed, naming it), only files with tests left go back on the queue, and a
worker is given files until it holds two tests or more, and told to stop once the queue is
empty. Everything else is xdist's own:
whole files per worker, in the order conftest.py sorts them.

xdist reports a crashed test as "worker 'gwN' crashed while running" and no more: what the
worker printed as it died went to the run's output as it happened, far above the report.
`WorkerLastWords` puts it in the report: each worker writes Python's fatal-error dump
(faulthandler: the signal and every thread's stack) to a file of its own, and a note after
each test (conftest.py's: its memory), and the controller adds both to the crashed test's
report.
"""

from __future__ import annotations

import faulthandler
import pathlib
import shutil
import tempfile

from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController


class CrashTolerantFileScheduling(LoadFileScheduling):
    def remove_node(self, node: WorkerController) -> str | None:
        workload = self.assigned_work.pop(node)
        if not self._pending_of(workload):
            return None
        unfinished = {scope: unit for scope, unit in workload.items() if not all(unit.values())}
        crashed_scope, crashed_unit = next(iter(unfinished.items()))
        crashitem = next(nodeid for nodeid, done in crashed_unit.items() if not done)
        crashed_unit[crashitem] = True  # reported failed by xdist; not run again
        if not all(crashed_unit.values()):
            self.workqueue[crashed_scope] = crashed_unit
            self.workqueue.move_to_end(crashed_scope, last=False)
        for scope, unit in unfinished.items():
            if scope != crashed_scope:
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        if self._pending_of(self.assigned_work[node]) > 2:  # xdist's low-water mark
            return
        # A worker runs a test once it knows the next one, so it keeps two at least (xdist's
        # first schedule does this; a replacement worker's does not), or is told to stop.
        while self.workqueue:
            try:
                self._assign_work_unit(node)
            except OSError:
                # The worker died and the news of it is still on its way: the file stays in
                # its work, which remove_node puts back on the queue when the news comes.
                break
            if self._pending_of(self.assigned_work[node]) >= 2:
                break
        if not self.workqueue:
            node.shutdown()  # it stops after the tests it was given


class WorkerLastWords:
    """A crashed worker's faulthandler dump and last note in its test's report, for
    conftest.py's hooks of the same names: the controller makes a directory as it starts its
    first worker and hands it to each (`configure_node`), each worker keeps its dump there
    (`configure`) and a note after each test (`note`), and the controller reads both back into
    the report of the test the worker crashed in (`handle_crash`)."""

    KEY = "crash_dump_dir"
    # The dump lists the newest thread first and the main one, the oldest, last.
    TAIL_CHARS = 8000

    def __init__(self) -> None:
        self.directory: pathlib.Path | None = None  # the controller's
        self._dump_file = None  # a worker's, open for as long as it runs
        self._note_path: pathlib.Path | None = None  # a worker's

    def configure_node(self, node: WorkerController) -> None:
        if self.directory is None:
            self.directory = pathlib.Path(tempfile.mkdtemp(prefix="worker-last-words-"))
        node.workerinput[self.KEY] = str(self.directory)

    def configure(self, config) -> None:
        workerinput = getattr(config, "workerinput", {})
        if self.KEY in workerinput:
            path = pathlib.Path(workerinput[self.KEY]) / f"{workerinput['workerid']}.txt"
            self._dump_file = path.open("w")
            faulthandler.enable(file=self._dump_file, all_threads=True)
            self._note_path = path.with_suffix(".note")

    def note(self, text: str) -> None:
        """In a worker: what its report says if it crashes later (the last note only)."""
        if self._note_path is not None:
            self._note_path.write_text(text)

    def handle_crash(self, report) -> None:
        if self.directory is None:
            return
        dump = self.directory / f"{report.node.gateway.id}.txt"
        words = dump.read_text(errors="replace").strip() if dump.exists() else ""
        if len(words) > self.TAIL_CHARS:  # the first line says what killed it
            words = f"{words.splitlines()[0]}\n[...]\n{words[-self.TAIL_CHARS :]}"
        if words:
            report.longrepr = (
                f"{report.longrepr}\n\nWhat the worker's Python said as it died:\n{words}"
            )
        note = dump.with_suffix(".note")
        if note.exists():
            report.longrepr = f"{report.longrepr}\n\nIts last note: {note.read_text()}"

    def unconfigure(self) -> None:
        if self._dump_file is not None:  # a worker's, done with its tests
            faulthandler.disable()
            self._dump_file.close()
            self._dump_file = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
