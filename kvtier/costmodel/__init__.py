"""The cost model: a step plan's predicted wall time from its operators.

    from kvtier.costmodel import CostModel, CostModelConfig, Calibration, get_hardware
    cm = CostModel(model_config, get_hardware("h200"),
                   Calibration.load("results/calibration/calib_h200_llama-2-13b.json"),
                   CostModelConfig(max_num_seqs=256, block_bytes=..., num_gpus=1))
    cm.predict_plan(plan).executor_s      # the runner's time for a StepPlan
    cm.predict(StepShape(...)).total_s    # + the engine loop around it

Files: `hardware.py` (ceilings, copy mechanisms), `operators.py` (FLOPs/bytes per operator),
`optimes.py` (operator times: calibrated curves or roofline), `overlap.py` (eager launch
queue), `model.py` (a step), `calibration.py` (what `kvtier profile` writes), `curves.py`,
`shape.py`. This package prices steps and nothing else: it imports no torch, engine, runner
or bench (tests/costmodel/test_torch_free.py), so the simulator and the planner run anywhere.
Measuring a GPU and fitting a Calibration is `kvtier/profiler/`, which sits above the engine.
"""

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import HardwareProfile, get_hardware, hardware_names
from kvtier.costmodel.model import CostModel, CostModelConfig, StepCost
from kvtier.costmodel.shape import StepShape

__all__ = ["Calibration", "CostModel", "CostModelConfig", "HardwareProfile", "StepCost",
           "StepShape", "get_hardware", "hardware_names"]
