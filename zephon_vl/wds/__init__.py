"""WebDataset shards: the tar member index (random access by key) and the shard writer."""
