"""The KV-memory policies on the GPU: copy overlap, agreement in bf16; results in
results/policies/."""
