"""The pricing model (`kvtier.costmodel`) imports no torch, engine, runner, bench or profiler:
a fresh interpreter with torch blocked imports every module of the package, loads a
calibration, builds a CostModel and prices steps, and its figures equal those this (torch
loaded) process gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kvtier.config import EngineConfig
from kvtier.core.plan import ScheduledRequest, StepPlan
from kvtier.costmodel import Calibration, CostModel, CostModelConfig, StepShape, get_hardware
from kvtier.policies import policy_names, system_cost_config
from kvtier.sampling_params import SamplingParams
from tests.costmodel.synthetic import MODEL, calibration, model_config

ROOT = Path(__file__).resolve().parents[2]

BLOCKED = ("torch", "triton")
# The layers above the pricing (or holding tensors): none of them may load with it.
ABOVE = ("kvtier.engine", "kvtier.runner", "kvtier.bench", "kvtier.sim", "kvtier.profiler",
         "kvtier.kernels", "kvtier.attention", "kvtier.model.llama", "kvtier.model.loader",
         "kvtier.server")
BLOCK = 2 * 4 * 16 * 5120 * 2

_GUARD = f"""
import importlib, json, pkgutil, sys

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked: the pricing model must not import it")

sys.meta_path.insert(0, _Blocked())
"""

_PRICE_BLOCKED = _GUARD + """
import kvtier.costmodel
for info in pkgutil.iter_modules(kvtier.costmodel.__path__, "kvtier.costmodel."):
    importlib.import_module(info.name)
from tests.costmodel.test_torch_free import price
figures = price()
figures["loaded"] = sorted(m for m in sys.modules if m.startswith(("kvtier", "torch", "triton")))
print(json.dumps(figures))
"""


def price() -> dict:
    """A calibrated and an eager cost model, a decode and a mixed step, a plan, and the cost
    config every registered policy's engine gets: what the simulator and the planner ask."""
    mc = model_config()
    with tempfile.TemporaryDirectory() as d:  # Calibration's own save/load round trip
        calibration().save(Path(d) / "calib.json")
        calib = Calibration.load(Path(d) / "calib.json")
    h200 = get_hardware("h200")
    graphs = CostModel(mc, h200, calib, CostModelConfig(max_num_seqs=256, block_bytes=BLOCK,
                                                        piecewise_graphs=True))
    eager = CostModel(mc, h200, calib, CostModelConfig(cuda_graphs=False, max_num_seqs=256,
                                                       block_bytes=BLOCK))
    decode = StepShape(num_decodes=64, decode_ctx_sum=64 * 1000, decode_ctx_max=1000,
                       num_sampled=64)
    mixed = StepShape(num_decodes=3, decode_ctx_sum=1500, decode_ctx_max=600,
                      prefills=((527, 100),), num_sampled=4)
    row = ScheduledRequest(request_id="r", token_ids=[1] * 100, start_pos=0,
                           new_block_ids=(tuple(range(7)),) * 10, reset_blocks=True, sample=True,
                           sampling_params=SamplingParams(), num_output_tokens=0)
    configs = {name: system_cost_config(EngineConfig(model=MODEL, model_config=mc,
                                                     kv_policy=name), BLOCK)
               for name in policy_names()}
    return {
        "decode": [graphs.predict(decode).total_s, graphs.predict(decode).graph],
        "mixed": [graphs.predict(mixed).total_s, graphs.predict(mixed).piecewise],
        "eager_mixed": [eager.predict(mixed).total_s, eager.predict(mixed).piecewise],
        "plan": graphs.predict_plan(StepPlan(scheduled=[row])).executor_s,
        "configs": {name: repr(c) for name, c in sorted(configs.items())},
    }


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_pricing_runs_with_torch_blocked():
    proc = _python(_PRICE_BLOCKED)
    assert proc.returncode == 0, proc.stderr
    blocked = json.loads(proc.stdout)
    loaded = blocked.pop("loaded")
    assert "kvtier.costmodel.model" in loaded and "kvtier.costmodel.overlap" in loaded
    assert not [m for m in loaded if m.startswith(BLOCKED)]
    assert not [m for m in loaded if m.startswith(ABOVE)], "the pricing loads a layer above it"
    assert blocked == json.loads(json.dumps(price()))  # the same figures as with torch
    assert blocked["decode"][1] and 0 < blocked["decode"][0] < blocked["mixed"][0]
    assert blocked["mixed"][1] and not blocked["eager_mixed"][1]  # pieces, then eager
    assert blocked["plan"] > 0 and {"recompute", "swap", "ellm"} <= set(blocked["configs"])


def test_the_guard_blocks_torch():
    """With the guard installed importing torch fails, so the test above can fail."""
    proc = _python(_GUARD + "import torch")
    assert proc.returncode != 0 and "torch is blocked" in proc.stderr
