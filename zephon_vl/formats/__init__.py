"""Dataset formats of zephon-vl: one module per format, registered by name in
`zephon_core.data.formats` (``webdataset``, ``text``, ``llava``, ``parquet``,
``messages``, ``obelics``, and the containers ``arrow`` and ``lance`` of
`zephon_vl.formats.containers`). See docs/data-formats.md."""
