"""Container health check for sparseserve images: ``python healthcheck.py [PATH]``.

GETs PATH (default ``/healthz``; ``/readyz`` for readiness) on the worker's own REST port
and exits 0 on a 200, 1 otherwise. It reads the same environment as the server, so it
follows ``SPARSESERVE_HTTP_PORT`` and, when ``SPARSESERVE_TLS_CERT`` is set, speaks HTTPS
(the REST port then serves HTTPS only). Standard library only: slim images have no curl.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "/healthz"
    port = os.environ.get("SPARSESERVE_HTTP_PORT") or "8000"
    host = os.environ.get("SPARSESERVE_HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    tls = bool(os.environ.get("SPARSESERVE_TLS_CERT"))
    # The check runs beside the server: the certificate names the service, not 127.0.0.1.
    context = ssl._create_unverified_context() if tls else None
    url = f"{'https' if tls else 'http'}://{host}:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=4, context=context) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"{url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
