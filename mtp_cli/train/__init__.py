"""`mtp train`: the training loop (`loop`) and the trackers it logs to (`tracking`). Checkpoints, FSDP and the
frozen trunk's state cache sit in `model`, below, because evaluation and decoding load runs too."""
