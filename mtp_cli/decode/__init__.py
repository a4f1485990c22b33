"""Decoding: plain KV-cache generation, MTP self-speculative decoding, and the drafters' vocabulary
(`draft_vocab`, which training uses too, to train the extra predictions over it). The benchmark that times
these decoders, `mtp specbench`, is `mtp_cli/bench/`."""
