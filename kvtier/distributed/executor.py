"""The driver's side: the worker processes, the pipes that carry each step's plan to them,
and the Executor the engine steps (rank 0's runner, which samples).

Why a pipe per worker rather than a broadcast over the process group: a dead worker shows
at once (a broken pipe, its exit code) instead of as a collective waiting out its timeout;
the device group carries only the forward's tensors (an object broadcast over NCCL would
copy the pickle to the GPU and back every step); the plan is pickled once and written to
each pipe. vLLM uses a shared-memory ring for the same message, which scales past a few
workers; a pipe is the simple version for the GPUs of one host.
"""

from __future__ import annotations

import pickle
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from kvtier.core.executor import PendingResult
from kvtier.core.plan import StepPlan, StepResult
from kvtier.distributed.messages import Stop, TPWorkerError, WorkerFailed, WorkerReady

READY_TIMEOUT_S = 300.0  # a worker's imports (torch) before it joins the group
EXIT_WAIT_S = 10.0


class Workers:
    """Ranks 1..N-1: their processes and the driver's end of their pipes."""

    def __init__(self, procs: list[Any], conns: list[Connection]):
        self.procs, self.conns = procs, conns
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def watch(self, on_death: Callable[[], None]) -> None:
        """Call `on_death` (from a daemon thread) as soon as a worker exits before `stop`:
        the driver may be waiting in a collective that, on NCCL, would otherwise wait out
        its timeout."""
        def run() -> None:
            wait([p.sentinel for p in self.procs])
            if not self._stopping.is_set():
                on_death()

        self._watcher = threading.Thread(target=run, name="kvtier-tp-watch", daemon=True)
        self._watcher.start()

    @classmethod
    def spawn(cls, args: Any, size: int, port: int) -> Workers:
        import torch.multiprocessing as mp

        from kvtier.distributed.worker import run_worker

        ctx = mp.get_context("spawn")  # CUDA cannot be forked; spawn is safe on the CPU too
        procs, conns = [], []
        for rank in range(1, size):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=run_worker, args=(rank, size, port, args, theirs),
                            name=f"kvtier-tp{rank}", daemon=True)
            p.start()
            theirs.close()
            procs.append(p)
            conns.append(ours)
        return cls(procs, conns)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Every worker alive and about to join the rendezvous (one that fails first would
        leave the driver waiting there for the group's timeout)."""
        for rank, (p, conn) in enumerate(zip(self.procs, self.conns), start=1):
            if not wait([conn, p.sentinel], timeout):
                raise TPWorkerError(f"tensor-parallel rank {rank} did not start in {timeout} s")
            if not isinstance(self._read(conn), WorkerReady):
                p.join(EXIT_WAIT_S)
                raise TPWorkerError(
                    f"tensor-parallel rank {rank} exited before it started (exit code "
                    f"{p.exitcode}; its stderr says why). Workers are spawned: they import "
                    "the main script again, so a script that starts the engine must do so "
                    "under `if __name__ == \"__main__\":`")

    def send(self, plan: StepPlan) -> None:
        data = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            for conn in self.conns:
                conn.send_bytes(data)
        except OSError as e:
            raise self.failure() or TPWorkerError(f"a tensor-parallel worker is gone: {e}") from e

    @staticmethod
    def _read(conn: Connection) -> Any:
        try:
            return conn.recv() if conn.poll() else None
        except (EOFError, OSError):
            return None

    def failure(self, wait_s: float = 5.0) -> TPWorkerError | None:
        """The first worker that failed or died (given `wait_s` to finish dying), or None."""
        for rank, (p, conn) in enumerate(zip(self.procs, self.conns), start=1):
            wait([conn, p.sentinel], wait_s)
            msg = self._read(conn)
            if isinstance(msg, WorkerFailed):
                return TPWorkerError(f"tensor-parallel rank {rank} failed:\n{msg.traceback}")
            p.join(0.5 if p.is_alive() else None)
            if p.exitcode is not None:
                return TPWorkerError(f"tensor-parallel rank {rank} died (exit code {p.exitcode})")
        return None

    def stop(self) -> None:
        """Ask every worker to exit, then make sure it has (terminate, kill)."""
        self._stopping.set()
        stop = pickle.dumps(Stop())
        for conn in self.conns:
            try:
                conn.send_bytes(stop)
            except OSError:
                pass
        for p in self.procs:
            p.join(EXIT_WAIT_S)
            if p.is_alive():
                p.terminate()
                p.join(EXIT_WAIT_S)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()
        # The watcher ends once the workers have; joined here, it drops what `on_death`
        # holds (the group) while this thread waits, not during the interpreter's exit,
        # where a daemon thread releasing a process group aborts the process.
        if self._watcher is not None:
            self._watcher.join(EXIT_WAIT_S)


class TPExecutor:
    """The engine's executor under tensor parallelism: each plan to the workers, then rank
    0's step (the forward's collectives keep the ranks in step); its result is the step's."""

    def __init__(self, runner: Any, workers: Workers, factory: Any):
        """`factory`: rank 0's TPRunnerFactory (the group it joined, closed last)."""
        self.runner, self.workers, self._factory = runner, workers, factory
        self._closed = False
        # An engine dropped without close() still stops its workers.
        self._stop_workers = weakref.finalize(self, workers.stop)

    @property
    def async_by_default(self) -> bool:
        return bool(self.runner.async_by_default)

    @property
    def supports_async(self) -> bool:
        return bool(self.runner.supports_async)

    def execute(self, plan: StepPlan) -> StepResult:
        return self.launch(plan).result()

    def launch(self, plan: StepPlan) -> PendingResult:
        self.workers.send(plan)
        try:
            return self.runner.launch(plan)
        except Exception as e:  # a collective that lost a rank
            failed = self.workers.failure()
            if failed is None:
                raise
            raise failed from e

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_workers()
        self.runner.close()
        self._factory.close()
