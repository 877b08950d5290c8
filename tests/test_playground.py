"""GET `/ui`: the chat playground, driven in headless Chromium against the real engine.

Every check reads what a user sees on the page: the answer's text, its state and stats line,
the notices that show the server's acknowledgements. Screenshots go to `test-artifacts/`.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from playwright.sync_api import (
    BrowserContext,
    Locator,
    Page,
    Request,
    ViewportSize,
    expect,
    sync_playwright,
)

from clients import outcomes_since, settled_metrics, web
from serving import LoopThread, RunningServer, loading_server

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

CHROMIUM = "/usr/bin/chromium"  # Debian's, installed by deploy/install-browser.sh
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
DESKTOP = ViewportSize(width=1200, height=860)
PHONE = ViewportSize(width=375, height=812)
# A prompt the greedy model answers at length: long enough to act on it midway.
LONG = "Write a long, detailed story about a dragon and a village."
LATEST = "[...document.querySelectorAll('.message.assistant')].pop()"
LATEST_LENGTH = f"{LATEST}.querySelector('.text').textContent.length"
LATEST_FAILED = f"{LATEST}.classList.contains('failed')"
FINISHED = re.compile(r"^(done|max tokens reached)$")  # end of sequence, or max_tokens
STATS = re.compile(r"^\d+ tokens · first token \d+ ms · \d+\.\d tokens/s$")
# Playwright waits for each condition as long as it takes: 0 is "no timeout" for its actions
# and waits; its assertions take no 0, so theirs is a day (pytest-timeout ends a test first).
NO_TIMEOUT = 0
ASSERTIONS_TIMEOUT_MS = 24 * 3600 * 1000
CHAT_API = "Chat API (/v1/chat/completions)"
CONTROL = "Control protocol (/generate)"
KEY = "playground-key-0123"  # the keyed servers' one key
WRONG_KEY = "not-the-key"
KEY_NEEDED = "This gateway needs an API key."
KEY_REFUSED = "The key was refused: check it and enter it again."
WAITING_FOR_KEY = "waiting for an API key…"
KEY_UNSENDABLE = re.compile(r"^A browser cannot send this key on a WebSocket")


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserContext]:
    with (
        tempfile.TemporaryDirectory(prefix="playground-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport=DESKTOP,
        )
        context.set_default_timeout(NO_TIMEOUT)
        expect.set_options(timeout=ASSERTIONS_TIMEOUT_MS)
        try:
            yield context
        finally:
            expect.set_options(timeout=None)  # back to Playwright's default
            context.close()


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    opened = browser.new_page()
    yield opened
    opened.close()


def answer(page: Page) -> Locator:
    return page.locator(".message.assistant").last


def length(page: Page) -> int:
    return len(answer(page).locator(".text").text_content() or "")


def wait_longer_than(page: Page, chars: int) -> int:
    """Waits until the latest answer has grown past `chars` characters; returns its length."""
    page.wait_for_function(f"n => {LATEST_FAILED} || {LATEST_LENGTH} > n", arg=chars)
    failed = answer(page).locator(".state").text_content()
    assert "failed" not in (answer(page).get_attribute("class") or ""), failed
    return length(page)


def tokens_shown(page: Page) -> int:
    """The token count on the latest answer's stats line, once it has finished."""
    stats = answer(page).locator(".stats").text_content() or ""
    assert STATS.match(stats), stats
    return int(stats.split()[0])


def send(page: Page, message: str) -> None:
    page.get_by_label("Message", exact=True).fill(message)
    page.get_by_label("Message", exact=True).press("Enter")


def to_chat_api(request: Request) -> bool:
    return request.method == "POST" and request.url.endswith("/v1/chat/completions")


def body_of(request: Request) -> dict[str, Any]:
    body = request.post_data_json
    assert isinstance(body, dict), request.post_data
    return body


def sent_messages(page: Page, message: str) -> list[dict[str, Any]]:
    """Sends `message` in chat-API mode; the `messages` of the POST that carried it."""
    with page.expect_request(to_chat_api) as sent:
        send(page, message)
    body = body_of(sent.value)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "model" not in body
    messages: list[dict[str, Any]] = body["messages"]
    assert messages[-1] == {"role": "user", "content": message}
    return messages


def enter_key(page: Page, key: str) -> None:
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Use key").click()


def authorization(request: Request) -> str | None:
    return request.all_headers().get("authorization")


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / name)


def see_it_grow(page: Page, state: Locator) -> None:
    """The latest answer grows as it is generated, and says so."""
    seen = [wait_longer_than(page, 0)]
    for _ in range(3):
        seen.append(wait_longer_than(page, seen[-1]))
    assert seen == sorted(set(seen))
    expect(state).to_have_text("generating…")
    expect(answer(page).locator(".stats")).to_contain_text("tokens so far")


def stop_answer(page: Page, state: Locator, idle_engine: Callable[[], None], limit: int) -> int:
    """Stop the answer midway: it says so, Send comes back, the engine lets it go; its length."""
    page.get_by_role("button", name="Stop").click()
    expect(state).to_have_text("stopped")
    stopped = length(page)
    assert 0 < tokens_shown(page) < limit
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()
    idle_engine()
    return stopped


def test_page_and_assets_are_served_from_the_gateway(server: RunningServer) -> None:
    page = web.get(server.http + "/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset, kind in (("playground.js", "text/javascript"), ("playground.css", "text/css")):
        served = web.get(f"{server.http}/ui/{asset}")
        assert served.status_code == 200 and served.headers["content-type"].startswith(kind)
        assert f"/ui/{asset}" in page.text
    assert web.get(server.http + "/ui/../app.py").status_code == 404
    assert web.get(server.http + "/ui/playground.html.bak").status_code == 404


def test_chat_streams_and_is_steered_from_the_page(
    server: RunningServer, page: Page, idle_engine: Callable[[], None]
) -> None:
    page.goto(server.http + "/ui")
    expect(page.locator("#connection")).to_have_text("connected")
    page.get_by_label("Max tokens").fill("300")
    temperature = page.get_by_label("Temperature")
    temperature.press("Home")  # greedy: the long answer is the same every run
    expect(page.locator("#temperature-value")).to_have_text("0")
    state = answer(page).locator(".state")

    send(page, LONG)
    expect(page.locator(".message.user .text")).to_have_text(LONG)
    # The answer grows as it is generated.
    see_it_grow(page, state)

    # Regenerate midway: the answer starts again from nothing and grows anew.
    before = wait_longer_than(page, 60)
    page.get_by_role("button", name="Regenerate").click()
    page.wait_for_function(f"n => {LATEST_LENGTH} < n", arg=before)
    expect(answer(page).locator(".attempt")).to_have_text("attempt 2")
    wait_longer_than(page, 20)
    expect(state).to_have_text("generating…")
    assert page.locator(".message.assistant").count() == 1

    # The temperature changes mid-answer and the server acknowledges it.
    temperature.press("ArrowRight")
    expect(page.locator("#notice")).to_have_text("Temperature 0.1 applied mid-answer.")
    grown = wait_longer_than(page, length(page))

    # Pause holds the answer still; Resume goes on from where it was.
    page.get_by_role("button", name="Pause").click()
    expect(state).to_have_text("paused")
    expect(page.get_by_role("button", name="Resume")).to_be_enabled()
    held = length(page)
    assert held >= grown
    idle_engine()  # nothing generates while paused
    # Markers: two temperature changes (back to 0.1) the server acknowledges; a token sent
    # while paused would reach the page before the second acknowledgement.
    temperature.press("ArrowRight")
    temperature.press("ArrowLeft")
    expect(page.locator("#notice")).to_have_text("Temperature 0.1 applied mid-answer.")
    expect(page.locator("#temperature-value")).to_have_text("0.1")
    assert length(page) == held
    expect(state).to_have_text("paused")
    page.get_by_role("button", name="Resume").click()
    expect(state).to_have_text("generating…")
    wait_longer_than(page, held + 60)

    # Stop ends it midway: it stops growing and says so.
    stopped = stop_answer(page, state, idle_engine, 300)

    # Thumbs up on it is recorded by the server; a token sent after the stop would have
    # reached the page before that acknowledgement.
    answer(page).get_by_role("button", name="Good answer").click()
    expect(answer(page).locator(".feedback-state")).to_have_text("Feedback recorded")
    assert length(page) == stopped

    # A second turn, short enough to finish, with its tokens, first-token time and speed.
    page.get_by_label("Max tokens").fill("24")
    send(page, "Now say it in one sentence.")
    expect(page.locator(".message.assistant")).to_have_count(2)
    expect(state).to_have_text(FINISHED)
    expect(answer(page).locator(".stats")).to_have_text(STATS)
    assert 0 < tokens_shown(page) <= 24
    # The earlier answer stays as it was stopped.
    assert len(page.locator(".message.assistant .text").first.text_content() or "") == stopped

    # Regenerate after it finished: a new answer in its place.
    page.get_by_role("button", name="Regenerate").click()
    expect(answer(page).locator(".attempt")).to_have_text("attempt 2")
    expect(state).to_have_text(FINISHED)
    expect(answer(page).locator(".stats")).to_have_text(STATS)
    expect(page.locator(".message.assistant")).to_have_count(2)
    expect(page.locator(".message.user")).to_have_count(2)

    screenshot(page, "playground-desktop.png")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    for name in ("Send", "Stop", "Pause", "Regenerate"):
        box = page.get_by_role("button", name=name).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    screenshot(page, "playground-phone.png")
    idle_engine()


@pytest.mark.long  # the page's own mode streams and stops in make test (the test above)
def test_chat_api_mode_streams_stops_and_shows_errors(
    server: RunningServer, page: Page, idle_engine: Callable[[], None]
) -> None:
    page.goto(server.http + "/ui")
    mode = page.get_by_label("Mode")
    mode.select_option(label=CHAT_API)
    # The control protocol's own features are not offered.
    expect(page.get_by_role("button", name="Pause")).to_be_hidden()
    expect(page.locator("#connection")).to_be_hidden()
    page.get_by_label("Max tokens").fill("24")
    page.get_by_label("Temperature").press("Home")
    expect(page.locator("#temperature-value")).to_have_text("0")
    state = answer(page).locator(".state")

    first = "What is the capital of France?"
    assert sent_messages(page, first) == [{"role": "user", "content": first}]
    expect(page.locator(".message.user .text")).to_have_text(first)
    wait_longer_than(page, 0)
    expect(state).to_have_text(FINISHED)
    expect(answer(page).locator(".stats")).to_have_text(STATS)
    assert 0 < tokens_shown(page) <= 24
    expect(answer(page).get_by_role("button", name="Good answer")).to_be_hidden()
    first_answer = answer(page).locator(".text").text_content()
    assert first_answer

    # A second turn carries the system prompt and the conversation so far.
    page.locator("summary", has_text="System prompt").click()
    page.get_by_label("System prompt").fill("You are a helpful assistant.")
    second = "And of Italy?"
    assert sent_messages(page, second) == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": first},
        {"role": "assistant", "content": first_answer},
        {"role": "user", "content": second},
    ]
    expect(page.locator(".message.assistant")).to_have_count(2)
    expect(state).to_have_text(FINISHED)
    expect(answer(page).locator(".stats")).to_have_text(STATS)
    second_answer = answer(page).locator(".text").text_content()

    # The conversation is the page's, whichever way it goes: a turn over the control protocol...
    mode.select_option(label=CONTROL)
    expect(page.locator("#connection")).to_have_text("connected")
    expect(page.get_by_role("button", name="Pause")).to_be_visible()
    send(page, "Thanks!")
    expect(page.locator(".message.assistant")).to_have_count(3)
    expect(state).to_have_text(FINISHED)
    third_answer = answer(page).locator(".text").text_content()

    # ...is in the history the chat API gets next. A long answer, stopped midway: the page
    # aborts the request and the server cancels the generation (it would otherwise go on).
    mode.select_option(label=CHAT_API)
    page.get_by_label("Max tokens").fill("1500")
    idle_engine()
    before = settled_metrics(server.http)
    history = sent_messages(page, LONG)
    assert [m["content"] for m in history if m["role"] == "assistant"] == [
        first_answer,
        second_answer,
        third_answer,
    ]
    see_it_grow(page, state)
    expect(page.get_by_role("button", name="Regenerate")).to_be_disabled()
    expect(page.get_by_label("Mode")).to_be_disabled()
    stopped = stop_answer(page, state, idle_engine, 1500)
    assert outcomes_since(before, settled_metrics(server.http), "openai_chat") == {"cancelled": 1}
    assert length(page) == stopped

    # An error from the server: OpenAI's body, shown on the answer, which is marked failed.
    page.get_by_label("Max tokens").fill("0")
    with page.expect_response(lambda r: to_chat_api(r.request)) as refused:
        send(page, "Hello?")
    assert refused.value.status == 400
    error = refused.value.json()["error"]
    assert error["param"] == "max_tokens"
    expect(page.locator(".message.assistant")).to_have_count(5)
    expect(state).to_have_text(f"error: {error['message']}")
    expect(answer(page)).to_have_class(re.compile(r"\bfailed\b"))

    # Regenerate sends the same conversation again, with the settings as they are now.
    page.get_by_label("Max tokens").fill("24")
    with page.expect_request(to_chat_api) as again:
        page.get_by_role("button", name="Regenerate").click()
    assert body_of(again.value)["messages"][-1] == {"role": "user", "content": "Hello?"}
    expect(answer(page).locator(".attempt")).to_have_text("attempt 2")
    expect(state).to_have_text(FINISHED)
    expect(answer(page).locator(".stats")).to_have_text(STATS)
    expect(answer(page)).not_to_have_class(re.compile(r"\bfailed\b"))
    expect(page.locator(".message.assistant")).to_have_count(5)
    screenshot(page, "playground-chat-api.png")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    for control in (page.get_by_label("Mode"), page.get_by_role("button", name="Stop")):
        box = control.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    screenshot(page, "playground-chat-api-phone.png")

    # The mode is remembered; back to the control protocol for what comes after.
    page.reload()
    expect(page.get_by_label("Mode")).to_have_value("chat")
    expect(page.get_by_role("button", name="Pause")).to_be_hidden()
    page.get_by_label("Mode").select_option(label=CONTROL)
    idle_engine()


def test_loading_status_while_the_engine_starts(
    loop_thread: LoopThread, engine: VllmEngine, page: Page
) -> None:
    with loading_server(loop_thread, engine) as (loading, finish_loading):
        try:
            page.set_viewport_size(PHONE)
            page.goto(loading.http + "/ui")
            banner = page.locator("#loading")
            expect(banner).to_be_visible()
            expect(banner).to_contain_text("Loading the model")
            expect(page.locator("#loading-detail")).to_have_text(
                re.compile(r"^\d+% · about \d+ s left")
            )
            page.get_by_label("Max tokens").fill("5")
            send(page, "Hello!")
            expect(answer(page).locator(".state")).to_have_text("waiting for the model…")
            screenshot(page, "playground-loading.png")
            finish_loading()
            expect(banner).to_be_hidden()
            expect(answer(page).locator(".state")).to_have_text(FINISHED)
            expect(answer(page).locator(".stats")).to_have_text(STATS)

            # A dropped connection is shown, and the next message opens a new one.
            page.evaluate("socket.close()")
            expect(page.locator("#connection")).to_have_text("disconnected · reconnects on send")
            expect(answer(page).get_by_role("button", name="Good answer")).to_be_hidden()
            send(page, "Thanks!")
            expect(page.locator("#connection")).to_have_text("connected")
            expect(answer(page).locator(".state")).to_have_text(FINISHED)
            expect(page.locator(".message.assistant")).to_have_count(2)
        finally:
            page.goto("about:blank")  # closes the page's WebSocket, which the shutdown waits for


def test_the_page_asks_for_the_key_and_keeps_it_in_the_tab(
    make_server: Callable[..., RunningServer], page: Page, idle_engine: Callable[[], None]
) -> None:
    keyed = make_server(API_KEYS=f"{KEY}:ui")
    page.goto(keyed.http + "/ui")
    key_field = page.get_by_label("API key")
    key_message = page.locator("#key-message")
    # The page's WebSocket is closed with 1008 before any message: the page asks for a key.
    expect(key_message).to_have_text(KEY_NEEDED)
    expect(key_field).to_be_visible()
    expect(key_field).to_have_attribute("type", "password")
    expect(page.locator("#connection")).to_have_text("needs an API key")

    # A wrong key is refused, and asked for again.
    enter_key(page, WRONG_KEY)
    expect(key_message).to_have_text(KEY_REFUSED)
    expect(key_field).to_be_visible()
    expect(key_field).to_have_value("")
    # One a subprotocol cannot carry (base64's `/` and `=`) is not sent on the WebSocket.
    enter_key(page, "c2VjcmV0/a2V5=")
    expect(key_message).to_have_text(KEY_UNSENDABLE)

    # The right key goes as the WebSocket's subprotocol, which the server accepts; not in
    # the URL.
    with page.expect_websocket() as opened:
        enter_key(page, KEY)
    assert opened.value.url == keyed.ws + "/generate"
    expect(page.locator("#connection")).to_have_text("connected")
    expect(key_field).to_be_hidden()
    assert page.evaluate("socket.protocol") == f"bearer.{KEY}"

    # A chat streams over it, and is stopped midway.
    page.get_by_label("Max tokens").fill("300")
    page.get_by_label("Temperature").press("Home")
    state = answer(page).locator(".state")
    send(page, LONG)
    see_it_grow(page, state)
    stop_answer(page, state, idle_engine, 300)
    # The key is this tab's: in sessionStorage, not in localStorage.
    assert page.evaluate("sessionStorage.getItem('playground.apiKey')") == KEY
    assert KEY not in page.evaluate("JSON.stringify(localStorage)")

    # A reload keeps it: the next message is answered without asking.
    page.reload()
    page.get_by_label("Max tokens").fill("24")
    send(page, "What is the capital of France?")
    expect(state).to_have_text(FINISHED)
    expect(answer(page).locator(".stats")).to_have_text(STATS)
    expect(key_field).to_be_hidden()

    # Chat-API mode: the key goes as `Authorization: Bearer`, and a chat streams.
    page.get_by_label("Mode").select_option(label=CHAT_API)
    page.get_by_label("Max tokens").fill("1500")
    with page.expect_request(to_chat_api) as sent:
        send(page, LONG)
    assert authorization(sent.value) == f"Bearer {KEY}"
    see_it_grow(page, state)
    stop_answer(page, state, idle_engine, 1500)
    expect(key_field).to_be_hidden()
    page.get_by_label("Mode").select_option(label=CONTROL)  # the mode is the browser's


def test_chat_api_mode_asks_for_the_key_when_refused(
    make_server: Callable[..., RunningServer], page: Page
) -> None:
    keyed = make_server(API_KEYS=f"{KEY}:ui")
    page.set_viewport_size(PHONE)
    page.goto(keyed.http + "/ui")
    key_message = page.locator("#key-message")
    expect(key_message).to_have_text(KEY_NEEDED)  # another tab's key is not this one's
    page.get_by_label("Mode").select_option(label=CHAT_API)
    page.get_by_label("Max tokens").fill("24")
    state = answer(page).locator(".state")

    # Sent without a key: the POST gets 401, and the answer waits for a key.
    with page.expect_response(lambda r: to_chat_api(r.request)) as refused:
        send(page, "What is the capital of France?")
    assert refused.value.status == 401 and authorization(refused.value.request) is None
    expect(state).to_have_text(WAITING_FOR_KEY)
    expect(key_message).to_have_text(KEY_NEEDED)

    # A wrong key: the answer is asked for again with it, refused, and the page says so.
    with page.expect_response(lambda r: to_chat_api(r.request)) as refused:
        enter_key(page, WRONG_KEY)
    assert refused.value.status == 401
    assert authorization(refused.value.request) == f"Bearer {WRONG_KEY}"
    expect(key_message).to_have_text(KEY_REFUSED)
    expect(state).to_have_text(WAITING_FOR_KEY)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(page, "playground-key.png")

    # The right key: the waiting answer is sent with it and streams to the end.
    with page.expect_request(to_chat_api) as sent:
        enter_key(page, KEY)
    assert authorization(sent.value) == f"Bearer {KEY}"
    expect(state).to_have_text(FINISHED)
    expect(answer(page).locator(".stats")).to_have_text(STATS)
    expect(page.get_by_label("API key")).to_be_hidden()
    expect(page.locator(".message.assistant")).to_have_count(1)
    page.get_by_label("Mode").select_option(label=CONTROL)
