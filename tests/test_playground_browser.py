"""The playground page in headless Chromium (Playwright driving Debian's chromium): a prompt,
a method change and a race, checked in the DOM: tokens marked by origin, figures updated, the
race's two texts identical at temperature 0, a step's draft on hover and from the keyboard,
a 4xx shown in the page, and no request to anything but the server the page came from.

Needs the ``playwright`` package (a dev dependency) and a Chromium binary: Debian's
``apt-get install chromium`` (what ``.ci/run`` installs), or $QUICKDRAFT_CHROMIUM. Without a
Chromium the test is skipped, saying so."""

from __future__ import annotations

import os
import shutil

import pytest
from test_server import ALWAYS, drafter, serving, tiny_target

from quickdraft import Engine
from quickdraft.drafters import DraftModelDrafter
from quickdraft.server.pool import MethodOption, OtherMethods

CHROMIUM = os.environ.get("QUICKDRAFT_CHROMIUM") or shutil.which("chromium")
# Without the background-networking flags Chromium calls home at start (refused here).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium (apt-get install chromium, or set QUICKDRAFT_CHROMIUM)"
)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return smollm2[1]


@pytest.fixture(scope="module")
def target(tokenizer):
    return tiny_target(tokenizer)


@pytest.fixture
def page_server(target, tokenizer):
    """Served: a draft model that is the target itself (every draft accepted at temperature
    0), and plain decoding, prompt lookup and an untrained EAGLE tree (mostly rejected) as
    methods a request may name."""

    def make(method: str) -> Engine:
        if method == "lookahead":
            raise ValueError("lookahead: refused for the test")
        return Engine(target, drafter(target, method), ALWAYS, tokenizer=tokenizer, max_batch=2)

    names = ("ar", "ngram", "eagle", "lookahead")
    options = tuple(MethodOption(m, f"{m} drafting") for m in names)
    served = Engine(target, DraftModelDrafter(target, 3), ALWAYS, tokenizer=tokenizer, max_batch=2)
    others = OtherMethods((MethodOption("draft_model", "draft model"), *options), make)
    with serving(served, tokenizer, others=others, method="draft_model") as url:
        yield url


def _numbers(page, pane: str) -> dict[str, str]:
    return {
        name: page.inner_text(f"#{pane} .fig-{name}") for name in ("tps", "tau", "forwards", "time")
    }


def test_prompt_method_change_and_race_in_a_real_browser(page_server):
    from playwright.sync_api import sync_playwright

    url = page_server
    requests: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("request", lambda request: requests.append(request.url))
        page.goto(url + "/")
        page.wait_for_function("document.querySelectorAll('#method option').length >= 4")
        assert page.input_value("#method") == "draft_model"

        # 1. A prompt, sent from the keyboard (Enter in a field submits the form).
        page.select_option("#mode", "completion")
        page.fill("#prompt", "def add(a, b):\n    return a + b\n\ndef add(a, b):")
        page.fill("#max-tokens", "16")
        page.focus("#max-tokens")
        page.keyboard.press("Enter")
        page.wait_for_selector("#pane-main[data-state=done]")
        origins = page.eval_on_selector_all(
            "#pane-main .tok", "spans => spans.map(s => s.dataset.origin)"
        )
        assert len(origins) == 16 and set(origins) == {"draft", "bonus"}
        figures = _numbers(page, "pane-main")
        assert float(figures["tps"]) > 0 and float(figures["tau"]) > 3.0
        assert int(figures["forwards"]) == 4  # 16 tokens, 4 a step
        rates = page.eval_on_selector_all("#pane-main .bar", "b => b.map(x => x.dataset.rate)")
        assert rates == ["1.000"] * 3
        # keyboard: focus the answer, move through its steps
        page.focus("#pane-main .output")
        page.keyboard.press("ArrowRight")
        assert page.get_attribute("#pane-main .step.selected", "data-step") == "1"
        assert "step 2 of 4" in page.inner_text("#detail")
        assert "The draft, in order" in page.inner_text("#detail")

        # 2. Another method: an untrained EAGLE tree, mostly corrected by the target.
        page.select_option("#method", "eagle")
        page.click("#generate")
        page.wait_for_selector("#pane-main[data-state=done]")
        origins = page.eval_on_selector_all(
            "#pane-main .tok", "spans => spans.map(s => s.dataset.origin)"
        )
        assert len(origins) == 16 and "corrected" in origins
        assert "eagle" in page.inner_text("#pane-main-title")
        page.hover("#pane-main .step[data-step='0']")
        assert "draft tree" in page.inner_text("#detail")

        # 3. A race: plain decoding against the draft model, side by side, same text.
        page.select_option("#method", "draft_model")
        page.click("#race")
        page.wait_for_selector("#race-result[data-identical]")
        assert page.get_attribute("#race-result", "data-identical") == "true"
        assert page.is_visible("#pane-plain")
        plain = page.eval_on_selector_all("#pane-plain .tok", "s => s.map(x => x.dataset.origin)")
        assert set(plain) == {"plain"} and len(plain) == 16
        assert page.inner_text("#pane-plain .fig-forwards") == "16"
        texts = [page.inner_text(f"#{pane} .output") for pane in ("pane-plain", "pane-main")]
        assert texts[0] == texts[1] and texts[0]
        assert "Identical texts" in page.inner_text("#race-result")

        # 4. Server errors are shown in the page: a refused request, and a race whose method
        #    is refused, which stops its plain-decoding half at once.
        page.fill("#max-tokens", "100000")
        page.click("#generate")
        page.wait_for_selector("#error:not([hidden])")
        assert "400: max_tokens must be in" in page.inner_text("#error")
        assert page.is_enabled("#generate")
        page.fill("#max-tokens", "2000")
        page.fill("#prompt", "x")
        page.select_option("#method", "lookahead")
        page.click("#race")
        page.wait_for_selector("#error:not([hidden])")
        page.wait_for_selector("#generate:enabled")
        assert "refused for the test" in page.inner_text("#error")
        assert page.eval_on_selector_all("#pane-plain .tok", "s => s.length") < 2000
        assert page.get_attribute("#race-result", "data-identical") is None
        page.fill("#seed", "1.5")
        page.click("#generate")
        page.wait_for_function("document.querySelector('#error').textContent.includes('seed')")
        assert 'seed: "1.5" is not an integer' in page.inner_text("#error")

        # 5. Bytes become text across tokens: a character split over two tokens shows whole,
        #    and token text is never read as HTML.
        shown = page.evaluate(
            r"""() => {
              const pane = panes.main;
              pane.reset("test");
              const bytes = (text) => Array.from(new TextEncoder().encode(text));
              const smile = bytes("\u{1F600}");
              const token = (b) => ({ id: 1, text: "", bytes: b });
              pane.addStep({ draft: [{ ...token(smile.slice(0, 2)), parent: -1 }],
                             accepted: [0], token: token(smile.slice(2)),
                             origin: "bonus", emitted: 2 });
              pane.addStep({ draft: [], accepted: [], token: token(bytes("<b>x</b>")),
                             origin: "plain", emitted: 1 });
              return [pane.output.textContent, pane.output.querySelectorAll("b").length];
            }"""
        )
        assert shown == ["\U0001f600<b>x</b>", 0]
        browser.close()

    assert requests and all(r.startswith(url + "/") for r in requests), requests
