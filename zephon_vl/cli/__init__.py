"""The `zephon-vl` command line: one module per command, registered in `main`."""
