"""The ``sparseserve`` command. ``sparseserve serve`` needs the ``[server]`` extra."""

from __future__ import annotations

import sys

USAGE = "usage: sparseserve serve [--help] [flags]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] != "serve":
        print(f"sparseserve: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        from sparseserve.server import main as serve_main
        import numba, fastapi, uvicorn  # noqa: F401,E401
    except ImportError as exc:
        print(f"sparseserve serve needs the server extra ({exc.name} is missing): "
              'pip install "sparseserve[server]"', file=sys.stderr)
        return 2
    return serve_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
