"""Dataset formats of zephon-vl: one module per format, registered by name in
`zephon_core.data.formats` (``webdataset``, ``text``, ``llava``, ``parquet``,
``messages``, ``obelics``). See docs/data-formats.md."""
