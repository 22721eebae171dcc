"""webfetch cases: each starts tests/oracle/webserver.py on its own loopback port (the setup), then fetches.

They are a group of their own (`record web`) because the control plane, not the sandbox, fetches: the replay
(test_oracle_web.py) runs the server on the host, next to the control plane.
"""

from pathlib import Path
from typing import Any

from tests.oracle.cases import Case

SERVER = (Path(__file__).parent / "webserver.py").read_text()
FIRST_PORT = 18730


def _web(name: str, path: str, **params: Any) -> Case:
    port = FIRST_PORT + len(CASES)
    url = path if "://" in path else f"http://127.0.0.1:{port}{path}"
    return Case(f"webfetch_{name}", "webfetch", {"url": url, **params}, {"server.py": SERVER}, git=False,
                setup=f"python3 server.py {port}")


# Not cases, as documented platform decisions (docs/tools.md): a call without `format` (upstream leaves it undefined,
# so it sends a browser Accept header and returns HTML unconverted; the platform applies the default, markdown), and
# a timeout's message (upstream: "The operation was aborted.").
CASES: list[Case] = []
_PAGES: list[tuple[str, str, dict[str, Any]]] = [
    ("markdown_page", "/html/page", {"format": "markdown"}),
    ("text_page", "/html/page", {"format": "text"}),
    ("html_page", "/html/page", {"format": "html"}),
    ("md_headings", "/html/headings", {"format": "markdown"}),
    ("md_nested_lists", "/html/nested-lists", {"format": "markdown"}),
    ("md_table", "/html/table", {"format": "markdown"}),
    ("md_image", "/html/image", {"format": "markdown"}),
    ("md_br", "/html/br", {"format": "markdown"}),
    ("md_pre_plain", "/html/pre-plain", {"format": "markdown"}),
    ("md_emphasis", "/html/emphasis", {"format": "markdown"}),
    ("md_escapes", "/html/escapes", {"format": "markdown"}),
    ("md_links", "/html/links", {"format": "markdown"}),
    ("md_whitespace", "/html/whitespace", {"format": "markdown"}),
    ("md_inline_code_backtick", "/html/inline-code-backtick", {"format": "markdown"}),
    ("md_unicode", "/html/unicode", {"format": "markdown"}),
    ("md_empty_body", "/html/empty-body", {"format": "markdown"}),
    ("md_definition", "/html/definition", {"format": "markdown"}),
    ("md_head_only_title", "/html/head-only-title", {"format": "markdown"}),
    ("md_comment", "/html/comment", {"format": "markdown"}),
    ("md_div_spans", "/html/div-spans", {"format": "markdown"}),
    ("md_code_no_lang", "/html/code-block-no-lang", {"format": "markdown"}),
    ("md_checkbox", "/html/checkbox", {"format": "markdown"}),
    ("text_quirks", "/html/text-quirks", {"format": "text"}),
    ("text_whitespace", "/html/whitespace", {"format": "text"}),
    ("text_head_only_title", "/html/head-only-title", {"format": "text"}),
    ("text_comment", "/html/comment", {"format": "text"}),
    ("plain_markdown", "/plain.txt", {"format": "markdown"}),
    ("plain_text", "/plain.txt", {"format": "text"}),
    ("plain_html", "/plain.txt", {"format": "html"}),
    ("json", "/data.json", {"format": "markdown"}),
    ("markdown_content", "/page.md", {"format": "text"}),
    ("xhtml_not_converted", "/xhtml", {"format": "markdown"}),
    ("status_404", "/missing", {"format": "text"}),
    ("status_500", "/error", {}),
    ("status_201", "/created", {"format": "text"}),
    ("status_204", "/nocontent", {"format": "text"}),
    ("forbidden", "/forbidden", {"format": "text"}),
    ("image_png", "/image.png", {"format": "markdown"}),
    ("image_mime_lowercased", "/upper-image", {}),
    ("svg_is_text", "/logo.svg", {"format": "text"}),
    ("redirect", "/redirect", {"format": "text"}),
    ("redirect_to_404", "/redirect-missing", {"format": "text"}),
    ("empty_body", "/empty", {"format": "text"}),
    ("no_content_type", "/no-type", {"format": "text"}),
    ("latin1_bytes", "/latin1", {"format": "text"}),
    ("bom_dropped", "/bom", {"format": "text"}),
    ("crlf_kept", "/crlf", {"format": "text"}),
    ("truncated_lines", "/lines", {"format": "text"}),
    ("truncated_bytes", "/wide", {"format": "text"}),
    ("truncated_one_line", "/one-line", {"format": "text"}),
    ("too_large_declared", "/big-declared", {"format": "text"}),
    ("too_large_streamed", "/big-stream", {"format": "text"}),
    ("headers_markdown", "/echo", {"format": "markdown"}),
    ("headers_text", "/echo", {"format": "text"}),
    ("headers_html", "/echo", {"format": "html"}),
    ("cloudflare_retry", "/challenge", {"format": "text"}),
    ("cloudflare_retry_fails", "/challenge-always", {"format": "text"}),
    ("query_string", "/plain.txt?a=1&b=two", {"format": "text"}),
]
for _name, _path, _params in _PAGES:
    CASES.append(_web(_name, _path, **_params))

# Refused before any request: no server is needed, but the setup still runs (harmlessly) on both sides.
_REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("ftp_scheme", {"url": "ftp://127.0.0.1/x", "format": "text"}),
    ("no_scheme", {"url": "127.0.0.1/x", "format": "text"}),
    ("upper_scheme", {"url": "HTTP://127.0.0.1:1/x", "format": "text"}),
    ("missing_url", {"format": "text"}),
    ("url_number", {"url": 5, "format": "text"}),
    ("format_invalid", {"url": "http://127.0.0.1:1/", "format": "xml"}),
    ("format_number", {"url": "http://127.0.0.1:1/", "format": 1}),
    ("timeout_string", {"url": "http://127.0.0.1:1/", "format": "text", "timeout": "5"}),
    ("timeout_too_big", {"url": "http://127.0.0.1:1/", "format": "text", "timeout": 121}),
    ("everything_missing", {}),
    ("connection_refused", {"url": "http://127.0.0.1:1/x", "format": "text"}),
]
for _name, _params in _REFUSED:
    CASES.append(Case(f"webfetch_{_name}", "webfetch", _params, git=False))
