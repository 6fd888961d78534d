"""JSON Schema export for producers written in other languages."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.events import EVENT_TYPES


def export_json_schemas(directory: Path) -> list[Path]:
    """Write one ``<EventName>.schema.json`` per event kind; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for event in EVENT_TYPES:
        path = directory / f"{event.__name__}.schema.json"
        path.write_text(json.dumps(event.model_json_schema(), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
