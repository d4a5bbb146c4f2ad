"""``GET /``: the playground, one self-contained page (``static/playground.html``: its script
and styles inline, nothing fetched from anywhere but this server).

It sends a prompt to the server's own OpenAI endpoints with ``quickdraft: {"method", "steps"}``
and draws what comes back: each token marked by where it came from (an accepted draft token,
the target's correction after a rejection, or its bonus token after a fully accepted branch),
each step's draft on hover or keyboard focus, live figures (tokens/s, mean accepted length,
acceptance by position, target forward passes), and a race of plain decoding against the
chosen method on the same prompt.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi.responses import HTMLResponse

# The page may talk to its own server only: no script, style, image, font or connection
# elsewhere (its script and styles are inline, hence 'unsafe-inline' for them and nothing else).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


@functools.cache
def playground_html() -> str:
    return resources.files("quickdraft.server").joinpath("static/playground.html").read_text()


def playground_response() -> HTMLResponse:
    return HTMLResponse(
        playground_html(),
        headers={
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )
