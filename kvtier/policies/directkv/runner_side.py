"""DirectKV's runner side: the source the runner asks for each step's host rows
(zero_copy_rows.py: stored and attended in place, in pinned host memory). On a GPU they run
on a side stream (side_stream.py, DirectKV's design) beside the device-resident rows'
attention; a decode-only step replays a full-model decode graph instead, its host rows in
line (graph_rows.py: the kernels read the pinned pages at addresses a capture keeps)."""

from __future__ import annotations

from typing import Any

from kvtier.policies.directkv.graph_rows import GraphRowInputs
from kvtier.policies.directkv.side_stream import SideStream
from kvtier.policies.directkv.zero_copy_rows import ZeroCopyRows
from kvtier.policies.host_resident.items import HostRows
from kvtier.policies.host_resident.runner_side import HostResidentSource, HostRowsLayout


class DirectKVSource(HostResidentSource):
    def __init__(self, runner: Any, rows_item: type[HostRows], side_stream: bool = True,
                 graphs: bool = True, partial_moves: bool = False):
        super().__init__(runner, rows_item)
        self.partial_moves = partial_moves  # rows may have device suffixes
        self.device = runner.device
        self.side = (SideStream(self.device) if side_stream and self.device.type == "cuda"
                     else None)
        self.graphs = graphs
        self._graph_inputs: GraphRowInputs | None = None  # on the first graph step

    def attention(self, layout: HostRowsLayout) -> ZeroCopyRows:
        r = self.runner
        return ZeroCopyRows(layout.num_rows, self.pages, r.layers_per_block, r.ops,
                            self.device, self.side, layout=layout, device_kv=r.gpu_kv)

    def graph_rows(self, rows: Any) -> ZeroCopyRows | None:
        """The step's rows as a decode graph's (graph_rows.py); None under
        `--no-directkv-graphs`."""
        if not self.graphs or not isinstance(rows, ZeroCopyRows) or rows.layout is None:
            return None
        if self._graph_inputs is None:
            self._graph_inputs = GraphRowInputs(self.runner, self.pages, self.partial_moves)
        return self._graph_inputs.fill(rows.layout)
