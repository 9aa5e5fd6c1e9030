"""zephon_vl: vision-language data on zephon_core's engine, and its TorchTitan integration.

The one namespace a user imports from (``from zephon_vl import vlm_recipe, ImageSettings,
Loader, Execution``): the vision names, and every name of ``zephon_core.__all__``
(recipes, loaders, settings, checkpoints), re-exported. They resolve lazily, so importing
the package does not import PIL, av or torch's distributed stack. The TorchTitan adapter
is ``zephon_vl.titan`` (it needs the ``[titan]`` extra); authors of formats, operators and
adapters find the engine's building blocks in ``zephon_core.extend`` (docs/api.md). The
layers (see docs/architecture.md): ``media`` and ``wds`` -> ``families`` and ``ops`` ->
``recipes``; ``cli``, ``demo``, ``titan`` and ``testing`` sit on top.
"""

from __future__ import annotations

import zephon_core
from zephon_core.extend import lazy_exports

#: the distribution's version, the same as ``zephon_core.__version__`` (one source)
__version__: str = zephon_core.__version__

_EXPORTS: dict[str, str] = {
    # media
    "IMAGE_EXTS": "zephon_vl.media.image",
    "ImageSettings": "zephon_vl.media.image",
    "VisionPatches": "zephon_vl.media.image",
    "normalization_table": "zephon_vl.media.image",
    "normalize_patches": "zephon_vl.media.image",
    "patch_rows": "zephon_vl.media.image",
    "frame_rows_uint8": "zephon_vl.media.image",
    "pillow_backend": "zephon_vl.media.image",
    "process_image": "zephon_vl.media.image",
    "smart_resize": "zephon_vl.media.image",
    "VideoSettings": "zephon_vl.media.video",
    "process_video": "zephon_vl.media.video",
    "decode_frames": "zephon_vl.media.video",
    "open_video_reference": "zephon_vl.media.video",
    "read_video_reference": "zephon_vl.media.video",
    # shards
    "ShardIndex": "zephon_vl.wds.index",
    "WebDatasetReader": "zephon_vl.wds.index",
    "load_index": "zephon_vl.wds.index",
    "ShardEntry": "zephon_vl.wds.index",
    "build_manifest": "zephon_vl.wds.manifest",
    "load_manifest": "zephon_vl.wds.manifest",
    "reader_from_manifest": "zephon_vl.wds.manifest",
    "shards_from_folder": "zephon_vl.wds.writer",
    "write_shards": "zephon_vl.wds.writer",
    # model families
    "ModelFamily": "zephon_vl.families.base",
    "TitanOptions": "zephon_vl.families.base",
    "VisionFamily": "zephon_vl.families.base",
    "QwenVL": "zephon_vl.families.qwen",
    "KimiK25": "zephon_vl.families.kimi",
    "kimi_tokenizer_dir": "zephon_vl.families.kimi",
    "MuseGlimmer": "zephon_vl.families.muse",
    "family_names": "zephon_vl.families.registry",
    "get_family": "zephon_vl.families.registry",
    "recipe_family": "zephon_vl.families.registry",
    "register_family": "zephon_vl.families.registry",
    "unregister_family": "zephon_vl.families.registry",
    "vision_family": "zephon_vl.families.registry",
    # operators and collate
    "DecodeVision": "zephon_vl.ops.multimodal",
    "TokenizeMultimodal": "zephon_vl.ops.multimodal",
    "DecodePlanned": "zephon_vl.ops.decode_rows",
    "VLCollate": "zephon_vl.ops.collate",
    "normalize_pixels": "zephon_vl.ops.device",
    "patch_rows_from_frames": "zephon_vl.ops.device",
    "to_device": "zephon_vl.ops.device",
    # recipes and demo data
    "vlm_demo": "zephon_vl.demo.recipes",
    "vlm_mix_demo": "zephon_vl.demo.recipes",
    "image_filler": "zephon_vl.ops.filler",
    "vlm_recipe": "zephon_vl.recipes",
    "VisionPackSettings": "zephon_vl.recipes",
    "DemoDataset": "zephon_vl.demo.data",
    "build_demo_dataset": "zephon_vl.demo.data",
    "default_demo_dir": "zephon_vl.demo.data",
}
#: everything a user imports from zephon_core, from here too (the same objects)
_EXPORTS.update({name: "zephon_core" for name in zephon_core.__all__})

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("zephon_vl", _EXPORTS, globals())
