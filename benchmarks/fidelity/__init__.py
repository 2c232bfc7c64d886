"""The simulator against the real H200; results in results/fidelity/."""
