"""Dataset formats of zephon-vl: one module per format, registered by name through the
``zephon.plugins`` entry point (`zephon_vl.plugin`): ``webdataset``, ``llava``, ``parquet``,
``messages``, ``obelics``, the table containers ``arrow`` and ``lance``
(`zephon_vl.formats.tables`) and the shard containers ``mds`` and ``litdata``
(`zephon_vl.formats.containers`). See docs/data-formats.md."""
