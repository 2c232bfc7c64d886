"""A tensor-parallel worker process (ranks 1..N-1): the same assembly as the driver's (so
every memory system's hooks run on every rank's runner), then one plan per step from the
driver's pipe into its runner. Its scheduler and KV manager are built and never used: the
driver's decide."""

from __future__ import annotations

import pickle
import traceback
from multiprocessing.connection import Connection
from typing import Any

from kvtier.distributed.messages import Stop, WorkerFailed, WorkerReady


def run_worker(rank: int, size: int, port: int, args: Any, conn: Connection) -> None:
    """Spawned entry point. Exits 0 after `Stop` or when the driver's end closes; on an
    error sends `WorkerFailed` (the driver's error names it) and exits 1."""
    runner, factory = None, None
    try:
        from kvtier.distributed.factory import TPRunnerFactory
        from kvtier.engine.assembly import assemble

        conn.send(WorkerReady(rank))
        factory = TPRunnerFactory(args.device, args.dtype, rank, size, port)
        runner = assemble(args, factory).executor
        serve_plans(runner, conn)
    except BaseException:
        try:
            conn.send(WorkerFailed(rank, traceback.format_exc()))
        except OSError:
            pass  # the driver is gone
        raise SystemExit(1) from None
    finally:
        if runner is not None:
            runner.close()
        if factory is not None:
            factory.close()


def serve_plans(runner: Any, conn: Connection) -> None:
    """Run each plan the driver sends, in order, until `Stop` (or the pipe closes). Nothing
    goes back per step: rank 0's result is the step's."""
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if isinstance(msg, Stop):
            return
        runner.launch(msg)
