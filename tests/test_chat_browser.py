"""The chat page in a real browser: headless Chromium driven by selenium against the real ``llava-normaligned chat``
(our model beside a stock LLaVA, ``--compare``). Upload an image, type a question, press Ask: both answers appear as
computed directly, with each model's norm ratio and figure; a file that is no image is a message in the page; the next
question is answered.

Needs Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium``, ``/usr/bin/chromedriver``) and selenium:
skipped, saying so, where one is missing, except under CI (``CI`` set), where it fails: CI installs them.
``CHAT_SCREENSHOTS=DIR`` keeps the page's screenshots there (else in the test's temporary folder).
"""

from __future__ import annotations

import os

import pytest

from tests.support.chat_server import MAX_NEW_TOKENS, QUESTION, ChatServer, direct, not_an_image, solid_image
from tests.support.messages import number

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 60  # seconds for anything the page does (an answer takes about a second on the tiny models)

pytestmark = pytest.mark.usefixtures("one_thread")


def _browser_or_skip():
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    try:
        import gradio  # noqa: F401
    except ImportError:
        missing.append("the gradio package")
    if missing:
        reason = f"the browser test needs {', '.join(missing)} (Debian: apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI installs them", pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def browser():
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1200"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_the_page_answers_shows_the_norms_and_says_what_is_wrong(browser, tiny_model_dir, stock_model_dir, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    shots = os.environ.get("CHAT_SCREENSHOTS") or str(tmp_path / "screenshots")
    os.makedirs(shots, exist_ok=True)
    image, notes = solid_image(tmp_path / "red.png"), not_an_image(tmp_path / "notes.png")
    expected = [direct(tiny_model_dir, image), direct(stock_model_dir, image)]
    server = ChatServer([tiny_model_dir, "--compare", stock_model_dir, "--max-new-tokens", str(MAX_NEW_TOKENS)])
    wait = WebDriverWait(browser, WAIT)

    def element(selector):
        return browser.find_element(By.CSS_SELECTOR, selector)

    def upload(path):
        clear = browser.find_elements(By.CSS_SELECTOR, "#image-file button[aria-label='Clear']")
        if clear:  # a file is there: take it away, and the upload field comes back
            clear[0].click()
        wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, "#image-file input[type=file]"))
        element("#image-file input[type=file]").send_keys(path)

    def answers():
        return [element(f"#answer-{i} textarea").get_attribute("value") for i in range(2)]

    def refuses_the_notes():  # the message names the file the user gave and says what is wrong with it
        message = element("#message").text
        return os.path.basename(notes) in message and "not an image" in message

    def ask_and_wait_for_the_answers():
        element("#ask").click()
        wait.until(lambda _: answers() == [e["answer"] for e in expected])

    try:
        browser.get(server.url)
        wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, "#image-file input[type=file]"))
        upload(image)
        wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, "#image-preview img"))
        element("#question textarea").send_keys(QUESTION)
        ask_and_wait_for_the_answers()
        for index, numbers in enumerate(expected):
            wait.until(lambda _, i=index: browser.execute_script(
                "const img = document.querySelector(arguments[0]); return img && img.complete && img.naturalWidth",
                f"#plot-{i} img"))
            shown = number(r"norm ratio at the LLM input: ([\d.e+-]+)", element(f"#norms-{index}").text)
            assert shown == pytest.approx(numbers["ratio"], rel=5e-3)  # to 3 significant digits
        assert element("#message").text == ""
        browser.save_screenshot(os.path.join(shots, "1_answered.png"))

        upload(notes)  # said as soon as it is uploaded
        wait.until(lambda _: refuses_the_notes())
        element("#ask").click()  # and when asked anyway: the answers are cleared, the message stays
        wait.until(lambda _: answers() == ["", ""])
        assert refuses_the_notes()
        browser.save_screenshot(os.path.join(shots, "2_not_an_image.png"))

        upload(image)
        wait.until(lambda _: element("#message").text == "")
        ask_and_wait_for_the_answers()
        browser.save_screenshot(os.path.join(shots, "3_asked_again.png"))
        assert server.running()
    finally:
        server.stop()
