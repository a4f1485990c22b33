"""`mtp specbench`: end-to-end decoding speed of a run's MTP drafters against plain decoding and the
Hugging Face peers, lossless checked on every prompt (`run`), with the per-width forward costs that
explain it (`forward_cost`). It drives the decoders in `mtp_cli.decode`, which know nothing of it."""
