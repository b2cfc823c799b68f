"""/docs (Swagger UI) and /redoc work with no internet: every file they load is the server's own.

The browser tests drive Debian's headless ``chromium`` through its ``chromedriver`` with
Selenium (make test installs both where it runs as root; elsewhere they skip and say how).
Chromium's own network log (the DevTools ``Network.requestWillBeSent`` events, which Selenium
reads as the "performance" log) lists every request a page made; each must be to this server.
A proxy that does not exist is set besides, so a request to any other host would fail rather
than reach it (Chromium never sends loopback requests through a proxy).
"""

from __future__ import annotations

import json
import re
import shutil
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
INSTALL = "apt-get install chromium chromium-driver (make test does it as root)"
# What each kind of file the pages load must be served as.
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".svg": "image/svg+xml",
                 ".json": "application/json"}
# The op tried from the page: a 2 x 2 COO matrix with two entries, made dense.
TO_DENSE_BODY = {"sp_input": {"indices": [[0, 1], [1, 0]], "values": [2.0, 3.0], "dense_shape": [2, 2]}}
TO_DENSE_ANSWER = {"outputs": {"output": {"dtype": "float64", "shape": [2, 2], "data": [0.0, 2.0, 3.0, 0.0]}}}


# What a page loads by itself: src and href attributes, ReDoc's spec-url, Swagger UI's `url: '...'`.
_REFERENCE = re.compile(r"""(?:\b(?:src|href|spec-url)="([^"]+)"|\burl: '([^']+)')""")


def page_references(base: str, path: str) -> list[str]:
    page = httpx.get(f"{base}{path}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), (path, page)
    return [a or b for a, b in _REFERENCE.findall(page.text)]


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_every_file_a_docs_page_references_is_on_this_server(server, path):
    assert "://" not in httpx.get(f"{server.http_url}{path}").text, "an absolute URL in the page"
    urls = page_references(server.http_url, path)
    assert len(urls) >= 3, urls  # a script, the favicon and the OpenAPI document at least
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc and url.startswith("/"), f"{path} loads {url} from elsewhere"
        response = httpx.get(urljoin(server.http_url, url))
        suffix = "." + parts.path.rsplit(".", 1)[-1]
        assert response.status_code == 200, (url, response.status_code)
        assert response.headers["content-type"].startswith(CONTENT_TYPES[suffix]), (url, response.headers)
        assert len(response.content) > 100, url


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip(f"chromium is not installed: {INSTALL}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox",  # root in CI: Chromium's sandbox refuses to run as root
                "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,2000",
                # Chromium's own traffic (updates, field trials) is not the page's: off.
                "--disable-background-networking", "--disable-component-update", "--no-first-run",
                "--proxy-server=http://127.0.0.1:9"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    # The driver is named, so Selenium Manager never tries to download one; it finds chromium.
    driver = webdriver.Chrome(options=options, service=DriverService(CHROMEDRIVER))
    yield driver
    driver.quit()


def requests_made(driver) -> list[dict]:
    """The requests the page made since the last call (from Chromium's network log): each with
    its URL, and whether it failed."""
    events = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    sent = {e["params"]["requestId"]: {"url": e["params"]["request"]["url"], "failed": None}
            for e in events if e["method"] == "Network.requestWillBeSent"}
    for e in events:
        if e["method"] == "Network.loadingFailed" and e["params"]["requestId"] in sent:
            sent[e["params"]["requestId"]]["failed"] = e["params"]["errorText"]
    return list(sent.values())


def assert_all_local(server, requests: list[dict]) -> None:
    """Every request is to this server (or a data: or blob: URL, which never leaves the page)
    and none failed."""
    assert requests, "the network log is empty"
    for request in requests:
        url = request["url"]
        if urlsplit(url).scheme not in ("data", "blob"):
            assert url.startswith(server.http_url + "/"), f"a request left the host: {url}"
        assert request["failed"] is None, request


def wait_for(driver, condition, what: str, seconds: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, seconds, poll_frequency=0.1).until(condition, f"{what} within {seconds} s")


def try_to_dense(browser) -> tuple[str, str]:
    """Open to_dense's operation on the page, write the body, execute: the status and body shown."""
    from selenium.webdriver.common.by import By

    op = wait_for(browser, lambda d: d.find_elements(By.ID, "operations-ops-op_to_dense_v1_ops_to_dense_post"),
                  "to_dense's operation")[0]
    op.find_element(By.CSS_SELECTOR, ".opblock-summary-control").click()
    wait_for(browser, lambda d: op.find_elements(By.CSS_SELECTOR, ".try-out__btn"), "Try it out")[0].click()
    body = wait_for(browser, lambda d: op.find_elements(By.CSS_SELECTOR, "textarea.body-param__text"),
                    "the request body editor")[0]
    body.clear()
    body.send_keys(json.dumps(TO_DENSE_BODY))
    op.find_element(By.CSS_SELECTOR, "button.execute").click()
    response = wait_for(browser, lambda d: op.find_elements(By.CSS_SELECTOR, ".live-responses-table tr.response"),
                        "the response")[0]
    status = response.find_element(By.CSS_SELECTOR, ".response-col_status").text.split()[0]  # "401 Undocumented"
    return status, response.find_element(By.CSS_SELECTOR, ".response-col_description pre").text


def test_swagger_ui_lists_the_ops_and_runs_one_offline(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(f"{server.http_url}/docs")
    wait_for(browser, lambda d: d.find_elements(By.ID, "operations-ops-op_to_dense_v1_ops_to_dense_post"),
             "to_dense's operation")
    paths = {e.get_attribute("data-path") for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    catalogue = {o["name"] for o in httpx.get(f"{server.http_url}/v1/ops").json()["ops"]}
    assert {f"/v1/ops/{name}" for name in catalogue} <= paths
    assert {"/v1/ops/to_dense", "/v1/ops/matmul", "/v2/health/ready", "/v2"} <= paths
    assert not browser.find_elements(By.CSS_SELECTOR, ".btn.authorize"), "no tokens, nothing to authorize"

    status, answer = try_to_dense(browser)
    assert status == "200" and json.loads(answer) == TO_DENSE_ANSWER
    assert_all_local(server, requests_made(browser))


def test_on_a_server_with_tokens_the_page_takes_one_and_sends_it(browser, shared_server):
    """The OpenAPI document declares the bearer scheme on the routes that need a token (not on the
    probes or the docs), so Swagger UI's Authorize button takes one and "Try it out" sends it."""
    from selenium.webdriver.common.by import By

    from conftest import ONE_TOKEN, ONE_TOKEN_INFO_LOGS

    srv = shared_server(*ONE_TOKEN_INFO_LOGS)  # tests/server/test_server_observability.py's server
    paths = httpx.get(f"{srv.http_url}/openapi.json").json()["paths"]
    assert paths["/v1/ops/to_dense"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in paths["/v2/health/ready"]["get"] and "security" not in paths["/healthz"]["get"]

    browser.get("about:blank")
    requests_made(browser)  # the log so far is the other tests'
    browser.get(f"{srv.http_url}/docs")
    status, answer = try_to_dense(browser)  # no token yet: refused, saying why
    assert status == "401" and json.loads(answer)["error"]["reason"] == "MISSING_TOKEN", (status, answer)
    browser.get(f"{srv.http_url}/docs")  # afresh, then authorize first
    wait_for(browser, lambda d: d.find_elements(By.ID, "operations-ops-op_to_dense_v1_ops_to_dense_post"),
             "to_dense's operation")
    browser.find_element(By.CSS_SELECTOR, ".btn.authorize").click()
    field = wait_for(browser, lambda d: d.find_elements(By.ID, "auth-bearer-value"), "the token field")[0]
    field.send_keys(ONE_TOKEN)
    browser.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper .btn.authorize").click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".auth-btn-wrapper .btn-done"), "Close")[0].click()
    status, answer = try_to_dense(browser)
    assert status == "200" and json.loads(answer) == TO_DENSE_ANSWER, (status, answer)
    assert_all_local(srv, requests_made(browser))


def test_redoc_lists_the_ops_offline(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(f"{server.http_url}/redoc")

    def rendered(driver):
        text = driver.find_element(By.TAG_NAME, "body").get_attribute("textContent")
        return "/v1/ops/to_dense" in text and text

    text = wait_for(browser, rendered, "ReDoc's operations")
    for path in ("/v1/ops/matmul", "/v1/tensors", "/v2/health/live", "Converts a sparse tensor to a dense one"):
        assert path in text, path
    assert_all_local(server, requests_made(browser))
