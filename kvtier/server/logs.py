"""What the server logs beside uvicorn's access log, in vLLM's flags: the periodic stats line
(stats_log.py; `--disable-log-stats`) and each request as it is submitted
(`--enable-log-requests`, its prompt ids cut to `--max-log-len`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.sampling_params import SamplingParams

logger = logging.getLogger("kvtier.requests")


@dataclass(frozen=True)
class ServerLogs:
    stats_interval_s: float | None = None  # None: no stats line
    requests: bool = False
    max_log_len: int | None = None  # prompt ids a request's line shows at most; None: all

    def __post_init__(self) -> None:
        if self.stats_interval_s is not None and not self.stats_interval_s > 0:
            raise ValueError(f"the stats interval must be > 0 s, got {self.stats_interval_s}")
        if self.max_log_len is not None and self.max_log_len < 0:
            raise ValueError(f"--max-log-len must be >= 0, got {self.max_log_len}")

    def request(self, request_id: str, prompts: Sequence[list[int]],
                params: SamplingParams) -> None:
        """The request's line, when requests are logged."""
        if not self.requests:
            return
        n = self.max_log_len
        shown = [p if n is None else p[:n] for p in prompts]
        logger.info("Received request %s: prompt_token_ids: %s, params: %s", request_id,
                    shown[0] if len(shown) == 1 else shown, params)
