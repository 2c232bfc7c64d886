"""Serving-shape experiments: latency under a real request stream; results in results/serving/."""
