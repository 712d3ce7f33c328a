"""Distributed inference: process groups and their collectives (parallel_state.py) and how
a model's matrices split across tensor-parallel ranks (sharding.py). Layers and workers
call it; it calls neither."""
