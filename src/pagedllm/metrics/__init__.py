"""Engine metrics: plain stats records produced by the engine core, read by loggers/exporters."""
