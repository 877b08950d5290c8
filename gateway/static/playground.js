// The chat playground: one WebSocket to /generate (docs/CONTROL.md), or, in chat-API mode,
// streamed POSTs to /v1/chat/completions (docs/OPENAI.md); plain DOM, no framework.
// Model output is only ever put on the page with textContent. When the gateway needs an API
// key (docs/SECURITY.md) the page asks for one and keeps it in this tab's sessionStorage.
"use strict";

const $ = (id) => document.getElementById(id);
const el = {
  chat: $("chat"), empty: $("empty"), model: $("model"), connection: $("connection"),
  loading: $("loading"), loadingDetail: $("loading-detail"), loadingProgress: $("loading-progress"),
  stop: $("stop"), pause: $("pause"), regenerate: $("regenerate"), newChat: $("new-chat"),
  temperature: $("temperature"), temperatureValue: $("temperature-value"),
  maxTokens: $("max-tokens"), notice: $("notice"), form: $("composer"), input: $("input"),
  send: $("send"), system: $("system"), template: $("message-template"), mode: $("mode"),
  keyForm: $("key-form"), keyMessage: $("key-message"), keyInput: $("api-key"),
};

const FINISH = { length: "max tokens reached", stop: "done", cancelled: "stopped" };
const CHAT_API = "/v1/chat/completions";
const MODE_KEY = "playground.mode";
const API_KEY = "playground.apiKey";  // in sessionStorage: this tab only (docs/PLAYGROUND.md)
const CLOSE_POLICY = 1008;  // how the gateway closes a WebSocket without a valid key
const KEY_NEEDED = "This gateway needs an API key.";
const KEY_REFUSED = "The key was refused: check it and enter it again.";
const KEY_UNSENDABLE = "A browser cannot send this key on a WebSocket (only letters, digits " +
  "and !#$%&'*+-.^_`|~): use the chat API mode, or another key.";
// What a WebSocket subprotocol can carry: an HTTP token (RFC 6455, 4.1).
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

const conversation = [];  // sent with each turn: {role, content}
let socket = null;    // the page's one WebSocket; opened again on the next send once it closes
let opening = null;   // the promise of the socket being opened
let held = null;      // JSON of the config the server holds on this socket (with modifies)
let turn = null;      // the answer being generated: {node, phase, tokens, regenerating}
let latest = null;    // the latest answer, which feedback refers to: {node, socket}
let rated = null;     // the answer whose feedback is on its way
let awaitingInit = false;  // after `regenerate`, what comes before the next init is the old answer's
let pendingControls = 0;   // controls sent and not yet acknowledged
const modifies = [];       // temperatures sent with `modify`, in the order of their acks
let healthTimer = null;
let mode = storedMode();   // "control": the WebSocket protocol; "chat": the chat API
let apiKey = storedKey();  // "" until the server asks for one

// --- the socket ----------------------------------------------------------------------------

function openSocket() {
  if (socket && socket.readyState === WebSocket.OPEN) return Promise.resolve(socket);
  if (opening) return opening;
  const used = apiKey;
  if (used && !TOKEN.test(used)) {
    if (controlTurn()) holdForKey();
    if (mode === "control") askForKey(KEY_UNSENDABLE, true);  // the chat API can carry it
    return Promise.reject(new Error("the API key cannot be sent on a WebSocket"));
  }
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  // A browser sets no headers on a WebSocket: the key goes as the subprotocol `bearer.<key>`,
  // which the gateway accepts and echoes (a key in the URL would end up in logs).
  const ws = new WebSocket(`${scheme}//${location.host}/generate`, used ? [`bearer.${used}`] : []);
  let heard = false;  // a message came: the key, if one was needed, was accepted
  socket = ws;
  held = null;
  showConnection("connecting", "connecting…");
  opening = new Promise((resolve, reject) => {
    ws.addEventListener("open", () => {
      opening = null;
      showConnection("connected", "connected");
      resolve(ws);
    });
    ws.addEventListener("close", (event) => {
      if (opening && socket === ws) {
        opening = null;
        reject(new Error("could not connect to the gateway"));
      }
      // Without a valid key the gateway accepts, then closes with 1008 before any message,
      // saying why ("a valid API key is required"); its other 1008s are not about the key.
      const refused = event.code === CLOSE_POLICY && !heard;
      const aboutKey = refused && (!event.reason || /\bkey\b/i.test(event.reason));
      onClose(ws, aboutKey ? { key: used } : null, refused ? event.reason : "");
    });
  });
  ws.addEventListener("message", (event) => {
    heard = true;
    if (socket === ws) onMessage(JSON.parse(event.data));
  });
  return opening;
}

function sendJson(message) {
  socket.send(JSON.stringify(message));
}

function onClose(ws, refusal, reason) {
  if (socket !== ws) return;
  socket = null;
  if (refusal) {
    showConnection("closed", "needs an API key");
    if (latest) showFeedbackButtons(latest.node, false);
    if (controlTurn()) holdForKey();
    return keyRefused(refusal.key);
  }
  showConnection("closed", "disconnected · reconnects on send");
  if (controlTurn()) endTurn(null, reason ? `refused: ${reason}` : "connection lost", true);
  else if (reason) notice(`The gateway refused the connection: ${reason}.`, true);
  if (latest) showFeedbackButtons(latest.node, false);
}

function showConnection(state, text) {
  el.connection.dataset.state = state;
  el.connection.textContent = text;
}

// --- server messages -----------------------------------------------------------------------

function onMessage(message) {
  switch (message.type) {
    case "status": return onStatus(message);
    case "init": return onInit(message);
    case "token": return onToken(message);
    case "completion": return onCompletion(message);
    case "error": return onError(message);
  }
}

function onStatus(status) {
  switch (status.operation) {
    case "model_loading":
      return showLoading(status);
    case "paused":
      acknowledged();
      if (controlTurn()) setPhase("paused");
      return notice(`Paused (${status.message}).`);
    case "resumed":
      acknowledged();
      if (controlTurn()) setPhase("generating");
      return notice("Resumed.");
    case "modified":
      acknowledged();
      return notice(`Temperature ${modifies.shift() ?? el.temperature.value} applied mid-answer.`);
    case "feedback_recorded":
      acknowledged();
      if (rated) rated.querySelector(".feedback-state").textContent = "Feedback recorded";
      return notice("Feedback recorded.");
  }
}

function onInit(init) {
  hideLoading();
  el.model.textContent = init.model;
  if (!controlTurn()) return;
  if (awaitingInit) acknowledged();
  awaitingInit = false;
  if (turn.regenerating) {  // a resume before the first token sends init again: not counted
    turn.regenerating = false;
    turn.node.dataset.attempt = String(Number(turn.node.dataset.attempt || 1) + 1);
    turn.node.querySelector(".attempt").textContent = `attempt ${turn.node.dataset.attempt}`;
  }
  turn.tokens = 0;
  text(turn.node).textContent = "";
  setPhase("generating");
}

function onToken(token) {
  if (!controlTurn() || awaitingInit) return;
  turn.tokens += 1;
  text(turn.node).textContent = token.generated_text;
  stats(turn.node).textContent = `${turn.tokens} tokens so far`;
  followScroll();
}

function onCompletion(completion) {
  if (!controlTurn() || awaitingInit) return;  // the cancelled answer a regenerate replaced
  text(turn.node).textContent = completion.generated_text;
  stats(turn.node).textContent = describe(completion);
  endTurn(completion.generated_text, FINISH[completion.finish_reason] || completion.finish_reason);
}

function onError(error) {
  // A control that crossed the end of the answer is refused; the answer itself is fine.
  const refusedControl = error.error === "invalid_request" && pendingControls > 0;
  if (refusedControl) acknowledged();
  if (controlTurn() && !refusedControl) {
    awaitingInit = false;
    endTurn(text(turn.node).textContent || null, `error: ${error.message}`, true);
  } else {
    notice(error.message, true);
  }
}

function describe(completion) {
  const tokens = completion.usage.completion_tokens;
  const parts = [`${tokens} tokens`];
  const timing = completion.timing;
  if (timing) {
    if (timing.first_token_ms != null) {
      parts.push(`first token ${Math.round(timing.first_token_ms)} ms`);
    }
    // The server's clock, from config to completion: queueing and pauses count too.
    if (timing.total_ms > 0) parts.push(`${(tokens / (timing.total_ms / 1000)).toFixed(1)} tokens/s`);
  }
  return parts.join(" · ");
}

// --- the API key ---------------------------------------------------------------------------

// The server refused `used` (or its absence, ""): ask for a key, unless one newer than the
// refused one is there to try.
function keyRefused(used) {
  if (apiKey && used !== apiKey) return keyEntered();
  if (used) rememberKey("");  // a refused key is not kept
  askForKey(used ? KEY_REFUSED : KEY_NEEDED, Boolean(used));
}

function askForKey(message, refused) {
  el.keyMessage.textContent = message;
  el.keyForm.toggleAttribute("data-refused", refused);
  el.keyForm.hidden = false;
  el.keyInput.value = "";
  el.keyInput.focus();
}

// A key to try: the answer waiting for it is sent again; in control mode the WebSocket opens
// with it at once (in chat-API mode the next request carries it).
function keyEntered() {
  if (turn?.phase === "key") return startAnswer(turn.node, turn.regenerating);
  if (mode === "control") return openSocket().catch(() => {});
  if (!socket) showConnection("idle", "not connected");
}

// The answer in progress waits for a key, and is sent again once one is entered.
function holdForKey() {
  if (turn.mode === "control") held = null;
  awaitingInit = false;
  pendingControls = 0;
  modifies.length = 0;
  text(turn.node).textContent = "";
  stats(turn.node).textContent = "";
  setPhase("key");
}

function storedKey() {
  try {
    return sessionStorage.getItem(API_KEY) || "";
  } catch {
    return "";
  }
}

function rememberKey(key) {
  apiKey = key;
  try {
    if (key) sessionStorage.setItem(API_KEY, key);
    else sessionStorage.removeItem(API_KEY);
  } catch { /* kept for this page only */ }
}

// --- loading status ------------------------------------------------------------------------

function showLoading(status) {
  el.loading.hidden = false;
  el.loadingProgress.value = status.progress;
  const eta = status.eta_seconds != null ? ` · about ${Math.ceil(status.eta_seconds)} s left` : "";
  el.loadingDetail.textContent = `${Math.round(status.progress)}%${eta} · ${status.message}`;
  // Status messages just stop once the engine is up: /health says when it is.
  if (!healthTimer) healthTimer = setInterval(checkHealth, 1000);
}

async function checkHealth() {
  try {
    const response = await fetch("/health", { cache: "no-store" });
    if (response.ok) return hideLoading();
    const health = await response.json();
    if (health.status === "failed") {
      clearInterval(healthTimer);
      el.loadingDetail.textContent = `the engine failed to start: ${health.error || "see the server log"}`;
    }
  } catch { /* the next tick tries again */ }
}

function hideLoading() {
  el.loading.hidden = true;
  clearInterval(healthTimer);
  healthTimer = null;
}

// --- turns ---------------------------------------------------------------------------------

async function submit() {
  const content = el.input.value.trim();
  if (turn || !content) return;
  el.input.value = "";
  addMessage("user", content);
  conversation.push({ role: "user", content });
  await startAnswer(addMessage("assistant", ""), false);
}

async function regenerate() {
  if (turn?.phase === "connecting" || turn?.phase === "key" || turn?.mode === "chat") return;
  if (turn) {
    awaitingInit = true;
    turn.regenerating = true;
    control("regenerate");
    turn.node.querySelector(".state").textContent = "regenerating…";
    return;
  }
  if (!latest) return;
  if (conversation.at(-1)?.role === "assistant") conversation.pop();
  await startAnswer(latest.node, true);
}

// Sends the conversation as a new config, or, when the server already holds exactly that
// config on this socket, asks it to `regenerate` it.
async function startAnswer(node, again) {
  if (latest && latest.node !== node) showFeedbackButtons(latest.node, false);
  latest = null;
  showFeedbackButtons(node, false);
  turn = { node, phase: "connecting", tokens: 0, regenerating: again, mode };
  text(node).textContent = "";
  stats(node).textContent = "";
  node.querySelector(".feedback-state").textContent = "";
  for (const thumb of node.querySelectorAll(".thumb")) thumb.removeAttribute("aria-pressed");
  node.classList.remove("failed");
  if (mode === "chat") return streamChat();
  setPhase("connecting");
  const config = {
    type: "config",
    messages: chatMessages(),
    parameters: { max_tokens: Number(el.maxTokens.value) || 256,
                  temperature: Number(el.temperature.value) },
    options: { include_timing: true },
  };
  try {
    await openSocket();
  } catch (e) {
    if (turn?.phase === "key") return;  // until a key the socket can carry is entered
    return endTurn(null, e.message, true);
  }
  const wanted = JSON.stringify({ messages: config.messages, parameters: config.parameters });
  if (again && held === wanted) {
    awaitingInit = true;
    control("regenerate");
  } else {
    sendJson(config);
    held = wanted;
  }
  setPhase("waiting");
}

function chatMessages() {
  const system = el.system.value.trim();
  return system ? [{ role: "system", content: system }, ...conversation] : [...conversation];
}

function endTurn(answer, state, failed = false) {
  const node = turn.node;
  if (answer) conversation.push({ role: "assistant", content: answer });
  node.querySelector(".state").textContent = state;
  node.classList.toggle("failed", failed);
  const viaSocket = turn.mode === "control";
  if (failed && viaSocket) held = null;  // a refused config leaves the server holding the one before
  turn = null;
  awaitingInit = false;
  pendingControls = 0;
  modifies.length = 0;
  latest = { node, socket: viaSocket ? socket : null };  // feedback is for the socket's answers
  showFeedbackButtons(node, !failed && latest.socket !== null);
  updateButtons();
}

// The turn in progress when it goes over the WebSocket: only that one hears its messages.
function controlTurn() {
  return turn?.mode === "control" ? turn : null;
}

// --- chat-API mode -------------------------------------------------------------------------

// One answer from POST /v1/chat/completions, streamed as server-sent events. Stop aborts the
// fetch, which closes the connection: the server then stops the generation.
async function streamChat() {
  const current = turn;
  const abort = new AbortController();
  current.abort = abort;
  const body = {
    messages: chatMessages(),
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number(el.temperature.value),
    // As typed, so the server's own validation shows (an empty field: the page's default).
    max_tokens: el.maxTokens.value === "" ? 256 : Number(el.maxTokens.value),
  };
  const got = {
    started: performance.now(), text: "", chunks: 0, firstTokenMs: null, finish: null, usage: null,
  };
  // The page's clock, from the request to the end of the answer.
  const summary = (usage) => describe({
    usage,
    timing: { first_token_ms: got.firstTokenMs, total_ms: performance.now() - got.started },
  });
  setPhase("waiting");
  const used = apiKey;
  const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
  if (used) headers.Authorization = `Bearer ${used}`;
  try {
    const response = await fetch(CHAT_API, {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      signal: abort.signal,
      cache: "no-store",
    });
    if (response.status === 401 && turn === current) {
      response.body?.cancel().catch(() => {});
      holdForKey();
      return keyRefused(used);
    }
    if (!response.ok) return endTurn(null, `error: ${await errorMessage(response)}`, true);
    for await (const data of serverSentEvents(response.body)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) {
        return endTurn(got.text || null, `error: ${chunk.error.message}`, true);
      }
      onChunk(current, chunk, got);
    }
    if (!got.finish) return endTurn(got.text || null, "connection lost", true);
    stats(current.node).textContent = summary(got.usage ?? { completion_tokens: got.chunks });
    endTurn(got.text || null, FINISH[got.finish] || got.finish);
  } catch (e) {
    if (!abort.signal.aborted) return endTurn(got.text || null, "connection lost", true);
    // Stopped: no usage comes, so the count is of the chunks received (a token each).
    if (got.chunks) stats(current.node).textContent = summary({ completion_tokens: got.chunks });
    endTurn(got.text || null, FINISH.cancelled);
  }
}

function onChunk(current, chunk, got) {
  if (chunk.model) el.model.textContent = chunk.model;
  if (chunk.usage) got.usage = chunk.usage;
  const choice = chunk.choices?.find((c) => c.index === 0);
  if (!choice) return;
  hideLoading();
  if (current.phase !== "generating") {
    if (current.regenerating) {
      current.node.dataset.attempt = String(Number(current.node.dataset.attempt || 1) + 1);
      current.node.querySelector(".attempt").textContent = `attempt ${current.node.dataset.attempt}`;
    }
    setPhase("generating");
  }
  const content = choice.delta?.content;
  if (content) {
    if (got.firstTokenMs === null) got.firstTokenMs = performance.now() - got.started;
    got.text += content;
    got.chunks += 1;
    text(current.node).textContent = got.text;
    stats(current.node).textContent = `${got.chunks} tokens so far`;
    followScroll();
  }
  if (choice.finish_reason) got.finish = choice.finish_reason;
}

// The `data:` of each event of a text/event-stream body, as it arrives.
async function* serverSentEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value, { stream: !done });
      let end;
      while ((end = /\r?\n\r?\n/.exec(buffer))) {
        const lines = buffer.slice(0, end.index).split(/\r?\n/);
        buffer = buffer.slice(end.index + end[0].length);
        const data = lines.filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""));
        if (data.length) yield data.join("\n");
      }
      if (done) return;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body?.error?.message) return body.error.message;
  } catch { /* not OpenAI's error body */ }
  return `HTTP ${response.status} ${response.statusText}`.trim();
}

// --- the mode ------------------------------------------------------------------------------

function storedMode() {
  try {
    return localStorage.getItem(MODE_KEY) === "chat" ? "chat" : "control";
  } catch {
    return "control";
  }
}

function applyMode() {
  el.mode.value = mode;
  const chat = mode === "chat";
  el.connection.hidden = chat;  // the WebSocket's state: not what chat-API mode uses
  el.pause.hidden = chat;
  for (const node of document.querySelectorAll("[data-for-mode]")) {
    node.hidden = node.dataset.forMode !== mode;
  }
  if (latest) {
    const rateable = latest.socket !== null && latest.socket === socket;
    showFeedbackButtons(latest.node, !chat && rateable && !latest.node.classList.contains("failed"));
  }
  updateButtons();
}

function control(action, parameters) {
  pendingControls += 1;
  sendJson(parameters ? { type: "control", action, parameters } : { type: "control", action });
}

function acknowledged() {
  pendingControls = Math.max(0, pendingControls - 1);
}

function setPhase(phase) {
  turn.phase = phase;
  const labels = {
    connecting: "connecting…", key: "waiting for an API key…", waiting: "waiting for the model…",
    generating: "generating…", paused: "paused",
  };
  turn.node.querySelector(".state").textContent = labels[phase];
  updateButtons();
}

function updateButtons() {
  const phase = turn ? turn.phase : "idle";
  el.send.disabled = phase !== "idle";
  el.newChat.disabled = phase !== "idle";
  // The server knows of the answer (one waiting for a key can still be given up with Stop).
  const sent = phase !== "idle" && phase !== "connecting" && phase !== "key";
  el.stop.disabled = !sent && phase !== "key";
  el.pause.disabled = phase !== "generating" && phase !== "paused";
  el.pause.textContent = phase === "paused" ? "Resume" : "Pause";
  el.regenerate.disabled = phase === "idle" ? latest === null : !sent || turn.mode === "chat";
  el.mode.disabled = phase !== "idle";
  // Changing it mid-answer is the control protocol's `modify`: the chat API has no such thing.
  el.temperature.disabled = phase !== "idle" && turn.mode === "chat";
}

// --- the page ------------------------------------------------------------------------------

function addMessage(role, content) {
  el.empty.hidden = true;
  const node = el.template.content.firstElementChild.cloneNode(true);
  node.classList.add(role);
  node.querySelector(".role").textContent = role === "user" ? "You" : "Assistant";
  text(node).textContent = content;
  node.querySelector(".feedback").addEventListener("click", (event) => {
    const thumb = event.target.closest(".thumb");
    if (thumb) sendFeedback(node, thumb.classList.contains("up") ? 1 : -1);
  });
  el.chat.append(node);
  followScroll(true);
  return node;
}

function sendFeedback(node, rating) {
  if (!latest || latest.node !== node || latest.socket !== socket || !socket) {
    return notice("Feedback can only go to the latest answer, while its connection is open.", true);
  }
  pendingControls += 1;  // until `feedback_recorded`
  rated = node;
  sendJson({ type: "feedback", rating });
  for (const thumb of node.querySelectorAll(".thumb")) {
    thumb.setAttribute("aria-pressed", String(thumb.classList.contains(rating > 0 ? "up" : "down")));
  }
  node.querySelector(".feedback-state").textContent = "sending…";
}

function showFeedbackButtons(node, shown) {
  node.querySelector(".feedback").hidden = false;
  for (const thumb of node.querySelectorAll(".thumb")) thumb.hidden = !shown;
}

function notice(message, isError = false) {
  el.notice.textContent = message;
  el.notice.classList.toggle("error", isError);
}

const text = (node) => node.querySelector(".text");
const stats = (node) => node.querySelector(".stats");

// Keeps the newest text in view unless the reader has scrolled up.
function followScroll(force = false) {
  const chat = el.chat;
  if (force || chat.scrollHeight - chat.scrollTop - chat.clientHeight < 80) {
    chat.scrollTop = chat.scrollHeight;
  }
}

el.form.addEventListener("submit", (event) => {
  event.preventDefault();
  submit();
});
el.input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    submit();
  }
});
el.stop.addEventListener("click", () => {
  if (!turn || turn.phase === "connecting") return;
  if (turn.phase === "key") return endTurn(null, "not sent: no API key", true);
  if (turn.mode === "chat") return turn.abort.abort();
  control("stop");
  turn.node.querySelector(".state").textContent = "stopping…";
});
el.pause.addEventListener("click", () => {
  if (!turn || (turn.phase !== "generating" && turn.phase !== "paused")) return;
  control(turn.phase === "paused" ? "resume" : "pause");
  el.pause.disabled = true;  // until the server acknowledges
});
el.regenerate.addEventListener("click", regenerate);
el.temperature.addEventListener("input", () => {
  el.temperatureValue.textContent = el.temperature.value;
});
el.temperature.addEventListener("change", () => {
  // Unless an answer is under way on the socket, it applies to the next answer.
  if (!controlTurn() || turn.phase === "connecting" || turn.phase === "key") return;
  const temperature = Number(el.temperature.value);
  modifies.push(temperature);
  control("modify", { temperature });
  if (held) {  // the server's config follows the modify: a later regenerate uses it
    const config = JSON.parse(held);
    config.parameters.temperature = temperature;
    held = JSON.stringify(config);
  }
  notice(`Setting the temperature to ${temperature}…`);
});
el.newChat.addEventListener("click", () => {
  if (turn) return;
  conversation.length = 0;
  latest = null;
  for (const node of el.chat.querySelectorAll(".message")) node.remove();
  el.empty.hidden = false;
  notice("");
  updateButtons();
});

el.keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const key = el.keyInput.value.trim();
  if (!key) return el.keyInput.focus();
  rememberKey(key);
  el.keyForm.hidden = true;
  el.keyInput.value = "";
  keyEntered();
});

el.mode.addEventListener("change", () => {
  if (turn) {  // the select is disabled during an answer
    el.mode.value = mode;
    return;
  }
  mode = el.mode.value === "chat" ? "chat" : "control";
  try {
    localStorage.setItem(MODE_KEY, mode);
  } catch { /* remembered for this page only */ }
  applyMode();
});

applyMode();
openSocket().catch(() => {});  // early, so the loading status shows before the first message
