"""``dimensions`` on ``/v1/embeddings``, honoured by the gateway for a Matryoshka model.

A Matryoshka model is trained so that the first N values of its vector are an embedding of
their own; cut there and scaled back to unit length, they are what OpenAI's ``dimensions``
promises. The engines differ (llama-server ignores ``dimensions``, vLLM honours it only for a
model its config marks), so the engine is asked for the whole vector and the gateway cuts it,
on every engine alike. Which models may be cut is their catalog entry's ``matryoshka``; the
request rules (``opod.gateway.validate``) refuse ``dimensions`` for any other.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from starlette.responses import Response

from opod.http import fastjson
from opod.http.fastpath import PreparedResponse

if TYPE_CHECKING:
    import numpy as np


def cut_embeddings(response: Response, dimensions: int) -> Response:
    """``response`` (an engine's 200 answer to ``/v1/embeddings``) with every vector cut to ``dimensions`` values and
    renormalised; the same object as given when it holds no vector to cut (an error, or vectors short enough)."""
    if response.status_code != 200:
        return response
    try:
        answer = fastjson.loads(bytes(response.body))
    except ValueError:
        return response
    items = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        return response
    import numpy as np  # here, not at the leader's start: only a cut needs it, and it is slow to import

    changed = False
    for item in items:
        vector = item.get("embedding") if isinstance(item, dict) else None
        if isinstance(vector, list) and len(vector) > dimensions:
            item["embedding"] = _unit(np.asarray(vector[:dimensions], dtype=np.float64)).tolist()
            changed = True
        elif isinstance(vector, str):
            values = np.frombuffer(base64.b64decode(vector), dtype="<f4")
            if len(values) > dimensions:
                cut = _unit(values[:dimensions].astype(np.float64)).astype("<f4")
                item["embedding"] = base64.b64encode(cut.tobytes()).decode()
                changed = True
    if not changed:
        return response
    headers = [(name, value) for name, value in response.raw_headers if name != b"content-length"]
    return PreparedResponse(fastjson.dumps(answer), 200, headers)


def _unit(vector: np.ndarray) -> np.ndarray:
    import numpy as np

    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector
