"""The Responses API's answer, made from a chat completion's: a whole chat answer becomes a ``response`` object,
a chat stream becomes the Responses event stream (``response.created`` … ``response.completed``, each event with
its ``type`` and ``sequence_number``). :mod:`opod.gateway.responses` translates the request and serves the route."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from opod.http import fastjson

__all__ = ["ResponseStream", "response_object", "translate_stream"]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """The request's settings, as a response object repeats them."""
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "store": False,
        "user": body.get("user"),
    }


def _skeleton(response_id: str, created: int, model: str, body: dict[str, Any], status: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "usage": None,
        **_echo(body),
    }


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached or 0), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _finish(response: dict[str, Any], finish_reason: str | None) -> None:
    if finish_reason == "length":
        response["status"], response["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    elif finish_reason == "content_filter":
        response["status"], response["incomplete_details"] = "incomplete", {"reason": "content_filter"}
    else:
        response["status"] = "completed"
        response["completed_at"] = int(time.time())


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def response_object(chat: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion as the ``response`` object the Responses API answers."""
    created = chat.get("created")
    created = created if isinstance(created, int) else int(time.time())
    response = _skeleton(_new_id("resp"), created, str(chat.get("model") or body.get("model") or ""), body, "completed")
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    text = message.get("content")
    if isinstance(text, str) and text:
        response["output"].append(_message_item(_new_id("msg"), text, status))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        response["output"].append(
            _call_item(
                _new_id("fc"),
                str(call.get("id") or _new_id("call")),
                str(fn.get("name") or ""),
                str(fn.get("arguments") or ""),
                "completed",
            )
        )
    if not response["output"]:
        response["output"].append(_message_item(_new_id("msg"), "", status))
    response["usage"] = _usage(chat.get("usage"))
    _finish(response, choice.get("finish_reason"))
    return response


class ResponseStream:
    """A chat completion stream's events (parsed ``data:`` objects) in, the Responses event stream out.

    Items open as the chat deltas bring them (the text, each tool call) and close, in order,
    when the next one opens or the answer ends; ``response.completed`` (or ``response.incomplete``,
    for an answer cut at ``max_output_tokens``) carries the whole response and its usage.
    """

    def __init__(self, body: dict[str, Any], model: str) -> None:
        self.response = _skeleton(_new_id("resp"), int(time.time()), model, body, "in_progress")
        self.sequence = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._open: dict[str, Any] | None = None
        """The output item being streamed (with its text or arguments so far)."""
        self._calls: dict[int, dict[str, Any]] = {}
        """Tool call index in the chat stream → its output item."""
        self.ended = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return (
            f"event: {kind}\ndata: ".encode()
            + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
            + b"\n\n"
        )

    def start(self) -> list[bytes]:
        snapshot = {**self.response, "output": []}
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        """One chat chunk's events."""
        out: list[bytes] = []
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.response["model"] = chunk["model"]
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._text(text)
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    out += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def _text(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        item = self._open
        if item is None or item["type"] != "message":
            out += self._close()
            item = self._open = _message_item(_new_id("msg"), "", "in_progress")
            index = len(self.response["output"])
            self.response["output"].append(item)
            out.append(self._event("response.output_item.added", output_index=index, item={**item, "content": []}))
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                )
            )
        part = item["content"][0]
        part["text"] += text
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._index(item),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        index = call.get("index", 0)
        fn = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            out += self._close()
            item = _call_item(
                _new_id("fc"), str(call.get("id") or _new_id("call")), str(fn.get("name") or ""), "", "in_progress"
            )
            self._calls[index] = self._open = item
            self.response["output"].append(item)
            out.append(self._event("response.output_item.added", output_index=self._index(item), item=dict(item)))
        fragment = fn.get("arguments")
        if isinstance(fragment, str) and fragment:
            item["arguments"] += fragment
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self._index(item),
                    delta=fragment,
                )
            )
        return out

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, x in enumerate(self.response["output"]) if x is item)

    def _close(self) -> list[bytes]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self._index(item)
        done = "incomplete" if self.finish_reason == "length" else "completed"
        out: list[bytes] = []
        if item["type"] == "message":
            part = item["content"][0]
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
                )
            )
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        item["status"] = done
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def end(self) -> list[bytes]:
        """The answer is complete: close the open item, then the whole response."""
        if self.ended:
            return []
        self.ended = True
        out = self._close()
        self.response["usage"] = self.usage
        _finish(self.response, self.finish_reason)
        kind = "response.incomplete" if self.response["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=self.response))
        return out

    def fail(self, error: dict[str, Any]) -> list[bytes]:
        """The chat stream broke off (the relay's error event): an ``error`` event, then ``response.failed``."""
        if self.ended:
            return []
        self.ended = True
        message = str(error.get("message") or "the answer was cut off")
        code = str(error.get("code") or "server_error")
        out = [self._event("error", code=code, message=message, param=None)]
        self.response.update(status="failed", error={"code": "server_error", "message": message}, usage=self.usage)
        out.append(self._event("response.failed", response=self.response))
        return out


async def translate_stream(
    chunks: AsyncIterable[str | bytes | memoryview], body: dict[str, Any], model: str
) -> AsyncIterator[bytes]:
    """A chat SSE byte stream as the Responses event stream; closing it closes the chat stream (its usage row says so)."""
    events = ResponseStream(body, model)
    pending = b""
    try:
        for event in events.start():
            yield event
        async for chunk in chunks:
            pending += chunk.encode() if isinstance(chunk, str) else bytes(chunk)
            *blocks, pending = pending.split(b"\n\n")
            out: list[bytes] = []
            for block in blocks:
                out += _block(events, block)
            if out:
                yield b"".join(out)
        tail = _block(events, pending) + events.end()
        if tail:
            yield b"".join(tail)
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


def _block(events: ResponseStream, block: bytes) -> list[bytes]:
    out: list[bytes] = []
    for line in block.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            out += events.end()
            continue
        try:
            chunk = fastjson.loads(data)
        except ValueError:
            continue
        if not isinstance(chunk, dict):
            continue
        if isinstance(chunk.get("error"), dict):
            out += events.fail(chunk["error"])
        else:
            out += events.feed(chunk)
    return out
