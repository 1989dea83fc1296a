"""The activation cache: what a backbone computed for a dataset, kept on disk and read back.

- `entries`: the cache's entries (fp16 arrays, memory-mapped), their keys, verification and writers.
- `extract`: the forward passes that fill it, one per batch for all requested layers and tokens choices.
- `inventory`: what is in the cache (`bench cache ls`) and removing it (`bench cache rm`).
"""
