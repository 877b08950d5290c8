"""Refusals naming what the docs say they name: a control-protocol `reattach` on a busy
connection names `$.type` whatever it holds (docs/CONTROL.md, "Reattaching")."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from control_client import config, control, until

from clients import CHAT, UNENDING, connect
from serving import RunningServer


@pytest.mark.parametrize("seconds", ["600", "0"], ids=["reattach-on", "reattach-off"])
def test_a_reattach_on_a_busy_connection_names_the_type_whatever_it_holds(
    make_server: Callable[..., RunningServer], seconds: str
) -> None:
    server = make_server(REATTACH_SECONDS=seconds)
    story = CHAT.format("Write a long story about a lighthouse.")
    with connect(server.ws + "/generate") as ws:
        ws.send(config(story, temperature=0, ignore_eos=True, max_tokens=UNENDING))
        own = until(ws, "init")[-1]["request_id"]
        for held in ({"request_id": "gen_000000000000"}, {}, {"request_id": 5}, {"received": -1}):
            ws.send(json.dumps({"type": "reattach", **held}))
            refused = until(ws, "error")[-1]
            assert refused["field"] == "$.type", (held, refused)
            assert refused["recoverable"] is True and refused["request_id"] == own
        ws.send(control("stop"))
        assert until(ws, "completion")[-1]["request_id"] == own
        if seconds != "0":  # nothing runs now: a reattach without its id names the id
            ws.send(json.dumps({"type": "reattach"}))
            assert until(ws, "error")[-1]["field"] == "$.request_id"
