"""Small helpers shared by every layer (no engine logic)."""
