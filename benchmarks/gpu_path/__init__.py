"""Decode and prefill steps of the engine against the rooflines, and their host time;
results in results/gpu_path/."""
