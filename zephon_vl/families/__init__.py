"""Model families: what a model fixes about its data (tokens, placeholder layout, image
settings, collate, TorchTitan inputs). See :mod:`zephon_vl.families.base`.

* :mod:`~zephon_vl.families.base`: ``ModelFamily``, ``VisionFamily``, ``TitanOptions``.
* :mod:`~zephon_vl.families.registry`: ``register_family``, ``get_family``, ``family_names``.
* :mod:`~zephon_vl.families.qwen`: ``QwenVL`` (``qwen3_5``), the first vision-language family.
* :mod:`~zephon_vl.families.kimi`: ``KimiK25`` (``kimi_k2_5``) and ``kimi_tokenizer_dir``.
* :mod:`~zephon_vl.families.muse`: ``MuseGlimmer`` (``muse_glimmer``).
* :mod:`~zephon_vl.families.text`: ``TextFamily`` (``text``).
"""
