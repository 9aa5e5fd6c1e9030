"""The envelope of zephon's state in a TorchTitan checkpoint, without importing torchtitan.

``ZephonDataLoader.state_dict()`` returns ``{STATE_KEY: wrap_state(state)}``;
``zephon-vl inspect`` reads the same envelope from a DCP folder.
"""

from __future__ import annotations

import json
from typing import Any

STATE_KEY = "zephon_state"
STATE_FORMAT = "zephon-titan-dataloader"
STATE_VERSION = 1


def wrap_state(state: dict[str, Any]) -> str:
    """Zephon's global state as the versioned JSON text every rank saves."""
    return json.dumps({"format": STATE_FORMAT, "version": STATE_VERSION, "zephon": state},
                      sort_keys=True)
