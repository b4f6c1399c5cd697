"""``POST /v1/rerank``: documents ordered by how well they answer a query.

The score is the share of the query's words a document contains (with a
small pull toward shorter documents), so the ranking is deterministic and
makes sense to a reader of a test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_WORD = re.compile(r"\w+")


def score(query: str, document: str) -> float:
    wanted = {w.lower() for w in _WORD.findall(query)}
    words = [w.lower() for w in _WORD.findall(document)]
    if not wanted or not words:
        return 0.0
    hits = len(wanted & set(words)) / len(wanted)
    return round(hits * (1.0 - 0.001 * min(len(words), 500)), 6)


def rerank(body: dict[str, Any], model: str, count_tokens: Callable[[str], int]) -> dict[str, Any]:
    """The answer to a rerank request whose fields were already checked."""
    query, documents = body["query"], body["documents"]
    ranked = sorted(range(len(documents)), key=lambda i: (-score(query, documents[i]), i))
    top_n = body.get("top_n") or len(documents)
    results = []
    for index in ranked[:top_n]:
        item: dict[str, Any] = {"index": index, "relevance_score": score(query, documents[index])}
        if body.get("return_documents"):
            item["document"] = {"text": documents[index]}
        results.append(item)
    tokens = count_tokens(query) + sum(count_tokens(d) for d in documents)
    return {
        "model": model,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }


def check(body: dict[str, Any]) -> str | None:
    """What is wrong with a rerank body, or ``None``."""
    if not isinstance(body.get("query"), str) or not body["query"]:
        return "`query` must be a non-empty string"
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        return "`documents` must be a non-empty list of strings"
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        return "`top_n` must be a positive integer"
    return None


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
