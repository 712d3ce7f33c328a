"""Device side: model loading, KV tensors, input preparation, forward and sampling."""
