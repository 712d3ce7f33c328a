"""Engine: the core loop (token ids only) and the frontend around it (text in, text out)."""
