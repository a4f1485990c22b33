"""Decoding: plain KV-cache generation, MTP self-speculative decoding, and the specbench benchmark."""
