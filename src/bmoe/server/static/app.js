// bmoe's page: a chat over /v1/chat/completions (streamed) and decisions over /v1/decide.
// Plain script, no build step and nothing fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
// vision: the server reads images (it runs with --mmproj); pending: the images attached to the chat
// message being written ({name, url}); reading: the attaching still under way.
const state = { messages: [], busy: false, key: localStorage.getItem("bmoe-api-key") || "",
  vision: false, pending: [], reading: Promise.resolve() };

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h["Authorization"] = "Bearer " + state.key;
  return h;
}

async function api(path, body) {
  const opts = body === undefined ? { headers: headers() } : { method: "POST", headers: headers(), body: JSON.stringify(body) };
  const res = await fetch(path, opts);
  if (res.status === 401) $("key-box").hidden = false;
  return res;
}

async function errorText(res) {
  try {
    const j = await res.json();
    return (j.error && j.error.message) || JSON.stringify(j);
  } catch (_) {
    return res.status + " " + res.statusText;
  }
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function addMsg(cls, text) {
  const m = el("div", "msg " + cls, text);
  $("log").appendChild(m);
  m.scrollIntoView({ block: "end" });
  return m;
}

// --- images (chat and decisions) ------------------------------------------------------
// A picked file as a data: URL: the page sends images inline, the server reads nothing else.
function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(new Error("could not read " + file.name));
    r.readAsDataURL(file);
  });
}

function thumb(image) {
  const img = el("img", "thumb");
  img.src = image.url;
  img.alt = image.name;
  return img;
}

// The user's message in the log, the images it carries ({name, url}) shown above its text.
function userMsg(text, images) {
  const m = addMsg("user", text);
  if (images.length) {
    const row = el("div", "thumbs");
    for (const image of images) {
      const img = thumb(image);
      img.dataset.testid = "sent-image";
      row.appendChild(img);
    }
    m.prepend(row);
  }
  return m;
}

// The server reads images only when it was started with --mmproj (/v1/session: config.mmproj);
// otherwise neither the chat nor the decide panel offers to attach one.
function hasVision(info) {
  return Boolean(info.config && info.config.mmproj);
}

function showImageControls() {
  const choose = $("choose").checked;
  $("image-row").hidden = !state.vision;
  $("attach").hidden = !state.vision || choose;
  $("attachments").hidden = !state.vision || choose;
}

function showPending() {
  $("attachments").replaceChildren(...state.pending.map((image, i) => {
    const item = el("div", "attachment");
    item.dataset.testid = "attachment";
    const drop = el("button", "remove", "×");
    drop.type = "button";
    drop.title = "Remove " + image.name;
    drop.setAttribute("aria-label", drop.title);
    drop.addEventListener("click", () => { state.pending.splice(i, 1); showPending(); });
    item.append(thumb(image), drop);
    return item;
  }));
}

async function attachFiles(files) {
  for (const file of files) {
    try {
      state.pending.push({ name: file.name, url: await readDataUrl(file) });
    } catch (e) {
      addMsg("error", String(e));
    }
  }
  showPending();
}

const fmt = (x, nd) => (typeof x === "number" && isFinite(x) ? x.toFixed(nd) : "–");
const pct = (p) => (p * 100).toFixed(1) + "%";

// The panel shows the latest turn: a chat turn (BMOE_DONE keys) or a decision (BMOE_DECIDE keys).
function showTelemetry(t) {
  $("t-prefill").textContent = fmt(t.prefill_tps, 1) + " tok/s";
  $("t-decode").textContent = t.tok_s === undefined ? "– (decision)" : fmt(t.tok_s, 1) + " tok/s";
  $("t-reused").textContent = String(t.n_reused) + " tok";
  const mib = t.read_mib !== undefined ? t.read_mib : (t.read_mb || 0) * 1e6 / 1048576;
  $("t-read").textContent = fmt(mib, 1) + " MiB";
  const hit = t.cache_hit_pct;
  $("t-hit").textContent = hit === undefined || hit < 0 ? "off" : fmt(hit, 1) + "%";
}

function metaLine(t) {
  const parts = ["prefill " + fmt(t.prefill_tps, 1) + " tok/s"];
  if (t.tok_s !== undefined) parts.push("decode " + fmt(t.tok_s, 1) + " tok/s");
  parts.push(t.n_reused + " reused");
  return parts.join(" · ");
}

// --- chat ------------------------------------------------------------------------------
// images ({name, url}): OpenAI image_url parts in front of the text. The message is kept with
// them, so every later turn sends them again, as the server's continued conversation holds them.
async function sendChat(text, images) {
  const parts = images.length
    ? [...images.map((image) => ({ type: "image_url", image_url: { url: image.url } })), { type: "text", text }]
    : text;
  state.messages.push({ role: "user", content: parts });
  userMsg(text, images);
  const bubble = addMsg("assistant", "");
  bubble.dataset.testid = "assistant";
  const reasoning = el("div", "reasoning");
  const answer = el("span", "answer");
  bubble.append(reasoning, answer);
  const res = await api("/v1/chat/completions", {
    messages: state.messages, stream: true, stream_options: { include_usage: true },
  });
  if (!res.ok) {
    state.messages.pop();
    bubble.classList.add("error");
    bubble.textContent = await errorText(res);
    return;
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "", content = "", done = false;
  while (!done) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") { done = true; break; }
        const chunk = JSON.parse(data);
        if (chunk.error) { bubble.classList.add("error"); answer.textContent += "\n" + chunk.error.message; continue; }
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        if (choice.delta.reasoning_content) reasoning.textContent += choice.delta.reasoning_content;
        if (choice.delta.content) { content += choice.delta.content; answer.textContent = content; }
        if (chunk.bmoe) {
          showTelemetry(chunk.bmoe);
          bubble.appendChild(el("div", "meta", metaLine(chunk.bmoe)));
        }
        bubble.scrollIntoView({ block: "end" });
      }
    }
  }
  state.messages.push({ role: "assistant", content });
}

// --- decisions -------------------------------------------------------------------------
// image: a data: URL or null; it goes in front of the question (the session's default place),
// so it is kept with the prefix for the next decision over the same image.
function decisionRequest(question, options, abstain, image) {
  const lettered = options.map((o, i) => LETTERS[i] + ") " + o);
  const req = {
    prefix: question + "\n",
    suffix: "Options:\n" + lettered.join("\n") + "\nAnswer with the letter.",
    choices: options.map((_, i) => LETTERS[i]),
  };
  if (image) req.images = [image];
  if (abstain !== null) req.abstain_below = abstain;
  return req;
}

// The decision's attached image as a data: URL, or null.
function readImage() {
  const file = state.vision && $("image").files[0];
  return file ? readDataUrl(file) : Promise.resolve(null);
}

function barRow(label, p, cls) {
  const row = el("div", "bar-row " + cls);
  row.dataset.testid = "bar";
  row.dataset.p = String(p);
  const track = el("div", "track");
  const fill = el("div", "fill");
  fill.style.width = Math.max(0, Math.min(100, p * 100)) + "%";
  track.appendChild(fill);
  row.append(el("span", "label", label), el("span", "pct", pct(p)), track);
  return row;
}

async function sendDecision(question, options, abstain) {
  const image = await readImage();
  userMsg(question + "\n" + options.map((o, i) => LETTERS[i] + ") " + o).join("\n"),
    image ? [{ name: $("image").files[0].name, url: image }] : []);
  const res = await api("/v1/decide", decisionRequest(question, options, abstain, image));
  if (!res.ok) { addMsg("error", await errorText(res)); return; }
  const r = await res.json();
  const card = addMsg("decision", "");
  card.dataset.testid = "decision";
  const title = r.best < 0 ? "Abstained" : "Decision: " + LETTERS[r.best] + ") " + options[r.best];
  card.appendChild(el("h3", "", title));
  r.choice_logp.forEach((lp, i) => {
    const row = barRow(LETTERS[i] + ") " + options[i], Math.exp(lp), i === r.best ? "best" : "");
    row.dataset.testid = "option-bar";
    card.appendChild(row);
  });
  const other = barRow("elsewhere", r.p_outside, "elsewhere");
  other.dataset.testid = "elsewhere-bar";
  card.appendChild(other);
  if (abstain !== null) {
    const pBest = Math.max(...r.choice_logp.map(Math.exp));
    const line = el("div", "abstain", "abstain below " + abstain + ": p(best) = " + pBest.toFixed(3) +
      (r.abstained ? " → abstained" : " → answered"));
    line.dataset.testid = "abstain-line";
    card.appendChild(line);
  }
  card.appendChild(el("div", "meta", metaLine(r)));
  showTelemetry(r);
  card.scrollIntoView({ block: "end" });
}

// --- wiring ----------------------------------------------------------------------------
async function loadInfo() {
  const res = await api("/v1/session");
  if (!res.ok) { $("model").textContent = await errorText(res); return; }
  const info = await res.json();
  $("model").textContent = info.model + " · " + info.arch + " · ctx " + info.n_ctx;
  const head = [["model", info.model], ["arch", info.arch], ["n_ctx", info.n_ctx], ["think_ctl", info.think_ctl],
    ["experts used", info.n_expert_used], ["decide", info.decide], ["streaming", info.streaming]];
  const shown = new Set(head.map(([k]) => k));
  const rows = [...head, ...Object.entries(info.config).filter(([k]) => !shown.has(k)),
    ["max_queue", info.server.max_queue], ["auth", info.server.auth]];
  const table = $("settings-table");
  table.replaceChildren(...rows.map(([k, v]) => {
    const tr = el("tr");
    tr.append(el("td", "", k), el("td", "", v === null ? "–" : String(v)));
    return tr;
  }));
  state.vision = hasVision(info);
  showImageControls();
  if (!info.decide) { $("choose").disabled = true; $("choose").parentElement.title = "the server runs with --no-decide"; }
}

function setChoose(on) {
  $("options-box").hidden = !on;
  $("question").placeholder = on ? "Question" : "Message";
  showImageControls();
}

async function onSubmit(ev) {
  ev.preventDefault();
  if (state.busy) return;
  const question = $("question").value.trim();
  if (!question) return;
  const choose = $("choose").checked;
  let options = [], abstain = null;
  if (choose) {
    options = $("options").value.split("\n").map((s) => s.trim()).filter(Boolean);
    if (options.length < 2 || options.length > LETTERS.length) {
      addMsg("error", "give between 2 and " + LETTERS.length + " options, one per line");
      return;
    }
    const a = $("abstain").value.trim();
    if (a !== "") abstain = Number(a);
  }
  state.busy = true;
  $("send").disabled = true;
  try {
    if (choose) await sendDecision(question, options, abstain);
    else {
      await state.reading;  // images picked just now are in the message too
      const images = state.vision ? state.pending : [];
      state.pending = [];
      showPending();
      await sendChat(question, images);
    }
    $("question").value = "";
  } catch (e) {
    addMsg("error", String(e));
  } finally {
    state.busy = false;
    $("send").disabled = false;
  }
}

$("composer").addEventListener("submit", onSubmit);
$("question").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !$("choose").checked) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("choose").addEventListener("change", (e) => setChoose(e.target.checked));
$("image").addEventListener("change", () => { $("image-clear").hidden = !$("image").files.length; });
$("chat-images").addEventListener("change", (e) => {
  const files = [...e.target.files];
  e.target.value = "";  // so the same file can be picked again
  state.reading = state.reading.then(() => attachFiles(files));
});
$("image-clear").addEventListener("click", () => { $("image").value = ""; $("image-clear").hidden = true; });
$("new-chat").addEventListener("click", () => {
  state.messages = [];
  state.pending = [];  // a new chat starts with nothing attached
  showPending();
  $("log").replaceChildren();
});
$("settings-btn").addEventListener("click", () => {
  const s = $("settings");
  s.hidden = !s.hidden;
  $("settings-btn").setAttribute("aria-expanded", String(!s.hidden));
});
$("key-save").addEventListener("click", () => {
  state.key = $("api-key").value.trim();
  localStorage.setItem("bmoe-api-key", state.key);
  $("key-box").hidden = true;
  loadInfo();
});
setChoose($("choose").checked);
loadInfo();
