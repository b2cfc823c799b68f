"""The sparseserve server: gRPC and REST over one op registry (``sparseserve serve``)."""

from .config import ServerConfig, build_parser, config_from_args

__all__ = ["ServerConfig", "build_parser", "config_from_args", "main"]


def main(argv: list[str] | None = None) -> int:
    from .app import run

    return run(config_from_args(argv))
