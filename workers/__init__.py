"""gpuci's GPU host side: GPU probing, leases, the batch runner and result parsing."""
