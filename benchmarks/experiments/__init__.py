"""Ideas measured and dropped; results in results/experiments/."""
