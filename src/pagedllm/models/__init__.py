"""Model architectures as PyTorch modules whose attention reads and writes the paged cache."""
