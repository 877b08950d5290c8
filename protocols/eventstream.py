"""SageMaker runtime wire: AWS binary event-stream framing, and the ModelError body.

A message is: total length, headers length (both big-endian uint32), the CRC32 of those 8
bytes, the headers (name length, name, type 7 = string, value length, value), the payload, and
the CRC32 of everything before it. botocore checks both CRCs.
"""

from __future__ import annotations

import struct
import zlib

import msgspec

MEDIA_TYPE = "application/vnd.amazon.eventstream"
_STRING = 7


def _headers(*pairs: tuple[str, str]) -> bytes:
    out = bytearray()
    for name, value in pairs:
        raw_name, raw_value = name.encode(), value.encode()
        out += struct.pack(">B", len(raw_name)) + raw_name
        out += struct.pack(">BH", _STRING, len(raw_value)) + raw_value
    return bytes(out)


def message(headers: bytes, payload: bytes) -> bytes:
    prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return head + struct.pack(">I", zlib.crc32(head))


_PAYLOAD_PART = _headers(
    (":event-type", "PayloadPart"),
    (":content-type", "application/octet-stream"),
    (":message-type", "event"),
)
_MODEL_STREAM_ERROR = _headers(
    (":exception-type", "ModelStreamError"),
    (":content-type", "application/json"),
    (":message-type", "exception"),
)


class _StreamError(msgspec.Struct):
    Message: str
    ErrorCode: str


_ENCODER = msgspec.json.Encoder()


def payload_part(data: bytes) -> bytes:
    """One PayloadPart event: `Bytes` of the model's answer, as the container wrote them."""
    return message(_PAYLOAD_PART, data)


def model_stream_error(text: str, code: str = "StreamBroken") -> bytes:
    """The exception frame that ends a stream whose model failed after it started answering."""
    return message(_MODEL_STREAM_ERROR, _ENCODER.encode(_StreamError(text, code)))


class ModelError(msgspec.Struct):
    """SageMaker's answer when the model (here: the LMI handler) answered with an error."""

    ErrorCode: str
    Message: str
    OriginalStatusCode: int
    OriginalMessage: str


def model_error(status: int, body: bytes) -> bytes:
    """The 424 body that botocore raises as `ModelError`, carrying the model's own answer."""
    side = "client" if status < 500 else "server"
    original = body.decode(errors="replace")
    message = f'Received {side} error ({status}) from model with message "{original}".'
    code = f"{side.upper()}_ERROR_FROM_MODEL"
    return _ENCODER.encode(ModelError(code, message, status, original))
