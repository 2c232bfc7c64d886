"""The profiler: measures a model's operators and whole steps on this GPU and fits the cost
model's Calibration (`kvtier profile`). It drives the real engine and runner, so it sits
above them; the pricing it feeds (`kvtier/costmodel/`) stays torch-free.

Files: `calibrate.py` (the `kvtier profile` CLI), `sweeps.py` / `step_sweeps.py` (operator
and whole-step measurements on a runner), `plans.py` (the synthetic plans they run),
`timing.py` (device timing), `warmup.py` (kernel variants compiled before timing),
`recording.py` (an executor wrapper that records every step), `loop_overhead.py` (the engine
loop's own host time, through the simulator), `fit.py` / `host_fit.py` (measurements -> a
Calibration; these two run anywhere).
"""
