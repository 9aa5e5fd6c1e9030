"""The `zephon-vl` command line: one module per command, each registered with
`registry.command`; `commands` lists them, `main` parses and dispatches."""
