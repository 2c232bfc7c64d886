"""`kvtier bench`: real workloads played against the engine in real time, one run per KV
policy side by side, with latency/throughput/SLO metrics, a JSON result and plots.

    workload (dataset + arrivals) -> runner (Backend: engine or HTTP) -> metrics -> report
"""
