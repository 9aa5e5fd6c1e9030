"""Where samples come from: shard readers, the work source (pointers per lane, no I/O), `Read`."""
