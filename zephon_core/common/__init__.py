"""Small shared pieces with no knowledge of the pipeline: hashing, digests, files, machine facts."""
