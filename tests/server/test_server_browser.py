"""The page in Debian's chromium, headless, driven by Playwright, against a live server on SmolLM2:
a decision's bars match /v1/decide for the same request, a chat streams and fills the telemetry
panel, and the page fits a phone; on the tiny qwen3vlmoe with its projector, images attached to a
decision or to chat messages are the ones the API gets. Screenshots go to $BMOE_SCREENSHOT_DIR (docs/img when
regenerating the docs' pictures) or the test's temporary folder."""

from __future__ import annotations

import base64
import math
import os
from pathlib import Path

import httpx
import pytest
from playwright import sync_api

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
QUESTION = "Which city is the capital of France?"
OPTIONS = ["London", "Paris", "Rome"]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}


@pytest.fixture()
def server(make_app, smol_path, live):
    return live(make_app(smol_path, n_predict=24))


@pytest.fixture()
def vl(tiny_dir) -> tuple[Path, Path]:
    """The tiny qwen3vlmoe and its vision projector."""
    from bmoe.testing import write_hf_arch, write_hf_mmproj

    return write_hf_arch("qwen3vlmoe", "q8_0", tiny_dir), write_hf_mmproj("qwen3vlmoe", tiny_dir)


def data_url(path: Path, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def chat_requests(page) -> list[dict]:
    """The bodies of the page's /v1/chat/completions requests, in order, as the browser sent them."""
    sent: list[dict] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None)
    return sent


@pytest.fixture()
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=30_000)
        yield b
        b.close()


@pytest.fixture()
def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("BMOE_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def page_request() -> dict:
    """What the page sends for QUESTION and OPTIONS (app.js: decisionRequest)."""
    letters = "ABC"
    return {
        "prefix": QUESTION + "\n",
        "suffix": "Options:\n"
        + "\n".join(f"{letters[i]}) {o}" for i, o in enumerate(OPTIONS))
        + "\nAnswer with the letter.",
        "choices": list(letters),
    }


def decide_on_page(page) -> list[str]:
    page.locator("label.switch").click()
    assert page.locator("#choose").is_checked() and page.locator("#options").is_visible()
    page.fill("#question", QUESTION)
    page.fill("#options", "\n".join(OPTIONS))
    page.click("#send")
    card = page.locator("[data-testid=decision]").last
    card.wait_for(timeout=30_000)
    return card.locator("[data-testid=option-bar] .pct").all_inner_texts()


def chat_on_page(page, text: str) -> str:
    if page.locator("#choose").is_checked():
        page.locator("label.switch").click()
    # Count every update of the answer while it streams in.
    page.evaluate("""() => { window.__updates = 0;
        new MutationObserver((ms) => { for (const m of ms) if (m.target.classList &&
            m.target.classList.contains('answer')) window.__updates++; })
        .observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true}); }""")
    page.fill("#question", text)
    page.click("#send")
    bubble = page.locator(".msg.assistant").last
    bubble.locator(".meta").wait_for(timeout=60_000)  # the final chunk's telemetry arrived
    return bubble.locator(".answer").text_content()


def test_decision_bars_match_the_api_and_chat_streams(server, browser, shots) -> None:
    page = browser.new_page(viewport=DESKTOP)
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.includes('SmolLM2')")
    # no --mmproj: neither the chat nor the decide panel offers to attach an image
    assert page.locator("#attach").is_hidden() and page.locator("#chat-images").is_hidden()

    shown = decide_on_page(page)
    assert page.locator("#image-row").is_hidden() and page.locator("#image").is_hidden()
    api = httpx.post(server.url + "/v1/decide", json=page_request(), timeout=60).json()
    assert len(shown) == 3
    for text, logp in zip(shown, api["choice_logp"], strict=True):
        assert abs(float(text.rstrip("%")) - 100 * math.exp(logp)) <= 0.051, (shown, api)
    elsewhere = page.locator("[data-testid=decision] [data-testid=elsewhere-bar] .pct").last.inner_text()
    assert abs(float(elsewhere.rstrip("%")) - 100 * api["p_outside"]) <= 0.051
    best = page.locator("[data-testid=decision] h3").last.inner_text()
    assert best.startswith("Decision: " + "ABC"[api["best"]])
    assert page.inner_text("#t-decode").startswith("–")  # a decision decodes nothing

    answer = chat_on_page(page, "Name three fruits.")
    assert answer.strip()
    assert page.evaluate("window.__updates") >= 3  # it arrived token by token, not at once
    for cell in ("#t-prefill", "#t-decode"):
        assert "tok/s" in page.inner_text(cell) and not page.inner_text(cell).startswith("–")
    assert page.inner_text("#t-reused").endswith("tok") and page.inner_text("#t-read").endswith("MiB")
    assert page.inner_text("#t-hit") == "off"  # resident model: no expert cache
    page.screenshot(path=str(shots / "server-desktop.png"))
    page.click("#settings-btn")
    settings = page.inner_text("[data-testid=settings]")
    assert "n_ctx" in settings and "decide_prefix_cache" in settings
    assert page.locator("#settings-table input").count() == 0  # read-only


def test_phone_width(server, browser, shots) -> None:
    ctx = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    page = ctx.new_page()
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.includes('SmolLM2')")
    chat_on_page(page, "Say hello.")
    bars = decide_on_page(page)
    assert len(bars) == 3
    page.fill("#abstain", "0.9")
    page.fill("#question", QUESTION)  # sending clears the question; the options stay
    page.click("#send")  # the same decision with an abstain threshold
    page.locator("[data-testid=abstain-line]").wait_for(timeout=30_000)
    assert "abstain below 0.9" in page.locator("[data-testid=abstain-line]").inner_text()
    # nothing wider than the screen, the controls on it
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    for sel in ("#send", "#question", "label.switch", "#telemetry"):
        box = page.locator(sel).bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], sel
    page.screenshot(path=str(shots / "server-phone.png"))
    ctx.close()


def test_the_page_asks_for_the_api_key(make_app, tiny_path, live, browser) -> None:
    from bmoe.server import ServerSettings

    server = live(make_app(tiny_path, ServerSettings(api_key="pa55")))
    page = browser.new_page(viewport=PHONE)
    page.goto(server.url + "/")
    page.locator("#key-box").wait_for(timeout=15_000)  # /v1/session said 401
    page.fill("#api-key", "pa55")
    page.click("#key-save")
    page.wait_for_function("document.getElementById('model').textContent.includes('tiny')")
    page.fill("#question", "hi")
    page.click("#send")
    page.locator(".msg.assistant .meta").wait_for(timeout=30_000)  # the chat went through with the key
    assert page.locator("#key-box").is_hidden()


def test_a_decision_over_an_attached_image(make_app, vl, live, browser, shots, tmp_path) -> None:
    """The tiny qwen3vlmoe with its projector: the image attached on the page goes as a data: URL in
    front of the question, and the bars are /v1/decide's for the same request with that image."""
    from bmoe.testing import write_png

    model, mmproj = vl
    shot = write_png(tmp_path / "screen.png", 128, 96, seed=1)
    server = live(make_app(model, mmproj=mmproj, chat="chatml"))
    page = browser.new_page(viewport=PHONE)
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.includes('ctx')")
    page.locator("label.switch").click()
    assert page.locator("#attach").is_hidden()  # the chat's own attach control is not the decision's
    page.set_input_files("#image", str(shot))
    assert page.locator("#image-clear").is_visible()
    page.fill("#question", QUESTION)
    page.fill("#options", "\n".join(OPTIONS))
    page.click("#send")
    card = page.locator("[data-testid=decision]").last
    card.wait_for(timeout=30_000)
    # the tiny model's choices are far below 0.1%: compare the bars' probabilities, not their text
    shown = [float(p) for p in card.locator("[data-testid=option-bar]").evaluate_all("rs => rs.map(r => r.dataset.p)")]
    sent = page.locator("[data-testid=sent-image]").last
    assert sent.is_visible() and sent.evaluate("img => img.naturalWidth") == 128

    url = data_url(shot)
    api = httpx.post(server.url + "/v1/decide", json={**page_request(), "images": [url]}, timeout=60).json()
    plain = httpx.post(server.url + "/v1/decide", json=page_request(), timeout=60).json()
    assert api["choice_logp"] != plain["choice_logp"]  # the image counts
    assert shown == pytest.approx([math.exp(lp) for lp in api["choice_logp"]], rel=1e-12, abs=0)
    assert shown != pytest.approx([math.exp(lp) for lp in plain["choice_logp"]], rel=1e-6, abs=0)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=str(shots / "server-image-decision.png"))

    page.click("#image-clear")  # removed: the next decision is over the text alone
    page.fill("#question", QUESTION)
    page.click("#send")
    page.locator("[data-testid=decision]").nth(1).wait_for(timeout=30_000)
    again = [
        float(p)
        for p in page.locator("[data-testid=decision]")
        .last.locator("[data-testid=option-bar]")
        .evaluate_all("rs => rs.map(r => r.dataset.p)")
    ]
    assert again == pytest.approx([math.exp(lp) for lp in plain["choice_logp"]], rel=1e-12, abs=0)


def test_a_chat_over_attached_images(make_app, vl, live, browser, shots, tmp_path) -> None:
    """Images attached to a chat message go as image_url parts in front of its text, and every later
    turn sends them again: each turn's answer is, bit for bit, what /v1/chat/completions answers to
    the same conversation on a second server that starts as fresh (greedy, one thread), and both
    servers reuse the same tokens (the image's among them) for the second turn."""
    from bmoe.testing import write_png

    model, mmproj = vl
    shot = write_png(tmp_path / "screen.png", 128, 96, seed=1)  # 12 image tokens
    other = write_png(tmp_path / "other.png", 96, 128, seed=2)
    server = live(make_app(model, mmproj=mmproj, chat="chatml"))
    ref = live(make_app(model, mmproj=mmproj, chat="chatml"))  # the same requests straight to the API
    page = browser.new_page(viewport=PHONE)
    sent = chat_requests(page)
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.includes('ctx')")
    assert page.locator("#attach").is_visible()

    page.set_input_files("#chat-images", [str(shot), str(other)])
    pending = page.locator("[data-testid=attachment]")
    pending.nth(1).wait_for(timeout=10_000)
    assert pending.count() == 2 and pending.nth(0).locator("img").get_attribute("alt") == "screen.png"
    pending.nth(1).locator("button.remove").click()  # other.png is not sent
    assert pending.count() == 1
    page.screenshot(path=str(shots / "server-image-chat-attach.png"))
    first = chat_on_page(page, "What is on the screen?")
    assert pending.count() == 0  # it went with the message
    thumbs = page.locator(".msg.user").last.locator("[data-testid=sent-image]")
    assert thumbs.count() == 1 and thumbs.evaluate("img => img.naturalWidth") == 128

    turn1 = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(shot)}},
                {"type": "text", "text": "What is on the screen?"},
            ],
        }
    ]
    assert sent[-1]["messages"] == turn1 and sent[-1]["stream"] is True
    direct = httpx.post(ref.url + "/v1/chat/completions", json={"messages": turn1}, timeout=60).json()
    assert first == direct["choices"][0]["message"]["content"]
    # the server's KV holds what the reference's does: the same prompt, image tokens and all, and answer
    n_past = httpx.get(server.url + "/v1/session", timeout=10).json()["stats"]["n_past"]
    assert n_past == httpx.get(ref.url + "/v1/session", timeout=10).json()["stats"]["n_past"]

    second = chat_on_page(page, "And the colours?")
    turn2 = turn1 + [{"role": "assistant", "content": first}, {"role": "user", "content": "And the colours?"}]
    assert sent[-1]["messages"] == turn2  # the image again, as the conversation's
    direct2 = httpx.post(ref.url + "/v1/chat/completions", json={"messages": turn2}, timeout=60).json()
    assert second == direct2["choices"][0]["message"]["content"]
    cached = direct2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= direct["usage"]["prompt_tokens"]  # the first turn's KV, image included, was reused
    assert page.inner_text("#t-reused") == f"{cached} tok"  # ... by the page's server too
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=str(shots / "server-image-chat.png"))

    plain = httpx.post(
        ref.url + "/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": "What is on the screen?"}], "max_tokens": 1},
    ).json()
    assert direct["usage"]["prompt_tokens"] >= plain["usage"]["prompt_tokens"] + 12  # the image is in it


def test_a_refused_image_leaves_the_chat_usable(make_app, vl, live, browser, tmp_path) -> None:
    """A file that is no image: the server's 400 shows as the page's other errors do, the refused
    message leaves the conversation, and the next message is answered."""
    model, mmproj = vl
    notes = tmp_path / "notes.txt"
    notes.write_text("not a picture")
    server = live(make_app(model, mmproj=mmproj, chat="chatml", n_predict=4))
    page = browser.new_page(viewport=PHONE)
    sent = chat_requests(page)
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.includes('ctx')")
    page.set_input_files("#chat-images", str(notes))
    page.locator("[data-testid=attachment]").wait_for(timeout=10_000)
    page.fill("#question", "What is this?")
    page.click("#send")
    refused = page.locator(".msg.assistant.error")
    refused.wait_for(timeout=30_000)
    assert "is not an image" in refused.inner_text()
    assert sent[-1]["messages"][0]["content"][0]["image_url"]["url"] == data_url(notes, "text/plain")
    assert page.locator("[data-testid=attachment]").count() == 0 and page.locator("#send").is_enabled()

    chat_on_page(page, "Say hello.")  # answered: its final chunk's telemetry arrived
    assert sent[-1]["messages"] == [{"role": "user", "content": "Say hello."}]  # the refused turn is gone
    assert page.locator(".msg.error").count() == 1 and page.inner_text("#t-decode").endswith("tok/s")
