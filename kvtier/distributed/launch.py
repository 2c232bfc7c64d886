"""`assemble_tp(args)`: the engine's parts with tensor_parallel_size > 1. The driver (rank 0,
this process) spawns ranks 1..N-1, each runs the assembly for itself; the driver's
scheduler and KV manager are the engine's, its executor sends each plan to the workers."""

from __future__ import annotations

from dataclasses import replace

from kvtier.config import ConfigError
from kvtier.distributed.executor import TPExecutor, Workers
from kvtier.distributed.parallel_state import free_port
from kvtier.distributed.sharding import check_tp
from kvtier.engine.args import EngineArgs
from kvtier.engine.assembly import EngineParts, assemble


def assemble_tp(args: EngineArgs) -> EngineParts:
    from kvtier.distributed.factory import TPRunnerFactory

    size = args.tensor_parallel_size
    check_tp(args.create_engine_config().model_config, size)  # before any process starts
    port = free_port()
    workers = Workers.spawn(args, size, port)
    factory = None
    try:
        workers.wait_ready()
        factory = TPRunnerFactory(args.device, args.dtype, 0, size, port)
        workers.watch(factory.group.abort)
        parts = assemble(args, factory)
    except BaseException as e:
        failed = None if isinstance(e, ConfigError) else workers.failure()
        if factory is not None:  # first: a worker waiting in a collective then fails too
            factory.close()
        workers.stop()
        if failed is not None:
            raise failed from e
        raise
    return replace(parts, executor=TPExecutor(parts.executor, workers, factory))
