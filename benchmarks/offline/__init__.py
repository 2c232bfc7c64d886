"""Offline throughput (every request at once), its floor and its profile; results in
results/offline/."""
