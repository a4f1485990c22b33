"""Data: corpus sources → tokenizer → cached token shards → batches."""
