import torch

# Tiny models are dominated by per-op overhead; one thread is faster and keeps runs reproducible.
torch.set_num_threads(1)
