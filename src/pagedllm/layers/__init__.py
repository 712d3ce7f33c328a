"""Building blocks of models: linear, norms, rotary, activations, attention, sampler."""
