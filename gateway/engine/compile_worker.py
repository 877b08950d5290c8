"""The constraint compiler's process (`python -m gateway.engine.compile_worker`): compiles one
constraint at a time with xgrammar, as the engine's backend will, and answers whether it could.

A compile cannot be stopped from inside (xgrammar's C++ holds the thread), so it runs here, in
a process the gateway kills at its deadline (gateway/engine/compile_pool.py); its address
space is capped, so a constraint that needs more memory fails here, not in the engine, and the
worker says so before it exits: only what it says is a verdict on the constraint.

Frames on stdin and stdout: a 4-byte big-endian length, then msgpack. First a `Setup`, answered
by `Ready`; then one `Job` per constraint, each answered by a `Verdict`.
"""

from __future__ import annotations

import os
import resource
import struct
import sys
from typing import BinaryIO, Literal

import msgspec

JobKind = Literal["json", "regex", "ebnf", "lark"]
_HEADER = struct.Struct(">I")


class Setup(msgspec.Struct, frozen=True):
    tokenizer_info: str  # xgrammar's TokenizerInfo.serialize_json()
    memory_bytes: int  # the address space a compile may add to what the worker holds at start
    any_whitespace: bool = True


class Ready(msgspec.Struct, frozen=True):
    pid: int


class Job(msgspec.Struct, frozen=True):
    kind: JobKind
    spec: str


class Verdict(msgspec.Struct, frozen=True):
    error: str | None = None  # None: it compiled
    out_of_memory: bool = False


def _frame(message: msgspec.Struct) -> bytes:
    body = msgspec.msgpack.encode(message)
    return _HEADER.pack(len(body)) + body


def write_frame(stream: BinaryIO, message: msgspec.Struct) -> None:
    stream.write(_frame(message))
    stream.flush()


def _read_frame(stream: BinaryIO) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack(header)
    return stream.read(length)


def frame_length(header: bytes) -> int:
    length: int = _HEADER.unpack(header)[0]
    return length


HEADER_BYTES = _HEADER.size


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[0])
    return pages * resource.getpagesize()


def main() -> None:
    import xgrammar

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    first = _read_frame(stdin)
    if first is None:
        return
    setup = msgspec.msgpack.decode(first, type=Setup)
    info = xgrammar.TokenizerInfo.deserialize_json(setup.tokenizer_info)
    # One thread: the engine keeps the other core; no cache: each verdict is the parent's.
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    compiler.compile_regex("a")  # whatever is built lazily, built before the cap
    # Built before the cap: saying it ran out of memory needs none (a worker that dies without
    # saying so is not taken for the constraint's verdict).
    out_of_memory = _frame(Verdict("it needs more memory than allowed", out_of_memory=True))
    cap = _address_space() + setup.memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    write_frame(stdout, Ready(pid=os.getpid()))
    jobs = msgspec.msgpack.Decoder(Job)
    while (frame := _read_frame(stdin)) is not None:
        job = jobs.decode(frame)
        try:
            match job.kind:
                case "json":
                    compiler.compile_json_schema(job.spec, any_whitespace=setup.any_whitespace)
                case "regex":
                    compiler.compile_regex(job.spec)
                case "lark":
                    compiler.compile_lark(job.spec)
                case "ebnf":
                    compiler.compile_grammar(job.spec)
        except MemoryError:
            stdout.write(out_of_memory)
            stdout.flush()
            return  # the parent starts a fresh worker
        except Exception as e:  # xgrammar's own refusal: a RuntimeError or ValueError
            exhausted = "bad_alloc" in str(e)
            write_frame(stdout, Verdict(str(e), exhausted))
            if exhausted:
                return
        else:
            write_frame(stdout, Verdict())


if __name__ == "__main__":
    main()
