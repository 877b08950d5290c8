"""`llm-gateway`: serve the gateway, or prepare the embedded default model."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from pathlib import Path

import msgspec

from gateway.config import ConfigError, Settings, load_settings
from gateway.feedback import FeedbackStore, feedback_path
from gateway.grpc_client import use_poller_client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve every protocol on one engine")
    serve.add_argument("--host", help="overrides HOST")
    serve.add_argument("--port", type=int, help="overrides PORT")
    serve.add_argument("--env-file", default=".env", help="the .env file to read (default .env)")
    commands.add_parser("prepare-model", help="convert the embedded default model, once")
    export = commands.add_parser("export-feedback", help="print stored feedback as JSON lines")
    export.add_argument("--db", help="the feedback database (default: FEEDBACK_DB's)")
    export.add_argument("--env-file", default=".env", help="the .env file to read (default .env)")
    commands.add_parser(
        "bench", help="benchmark every protocol (llm-gateway bench --help)", add_help=False
    )
    commands.add_parser("container", help="the container image's entry (docs/DEPLOY.md)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["container"]:  # serve, SageMaker's serve, health: gateway/container.py
        from gateway.container import main as container

        return container(argv[1:])
    if argv[:1] == ["bench"]:  # its own package and options: see gateway_bench/options.py
        try:
            from gateway_bench import main as bench
        except ModuleNotFoundError as e:  # the bench extra is not installed
            print(
                f"llm-gateway bench: {e.name} is missing; pip install 'llm-gateway[bench]'",
                file=sys.stderr,
            )
            return 2
        return bench(argv[1:])
    args = parser.parse_args(argv)

    if args.command == "prepare-model":
        from gateway.default_model import prepare_default_model

        print(prepare_default_model())
        return 0
    try:
        settings = load_settings(dotenv_path=args.env_file)
    except ConfigError as e:
        print(f"llm-gateway: invalid configuration: {e}", file=sys.stderr)
        return 2
    if args.command == "export-feedback":
        return _export_feedback(Path(args.db) if args.db else feedback_path(settings))
    try:
        return run_server(settings, args.host or settings.host, args.port or settings.port)
    except ConfigError as e:
        print(f"llm-gateway: invalid configuration: {e}", file=sys.stderr)
        return 2


def _export_feedback(path: Path) -> int:
    if not path.is_file():
        print(f"llm-gateway: no feedback database at {path}", file=sys.stderr)
        return 1
    encoder = msgspec.json.Encoder()
    for record in FeedbackStore(path).records():
        sys.stdout.write(encoder.encode(record).decode() + "\n")
    return 0


def run_server(settings: Settings, host: str, port: int) -> int:
    if settings.engine_replicas:
        use_poller_client()  # before gateway.app imports Ray, and Ray gRPC
    from gateway.app import create_app
    from gateway.server import GatewayServer, uvicorn_config

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server: GatewayServer | None = None

    def give_up(reason: str) -> None:
        if server is not None:
            server.give_up(reason)

    app = create_app(settings, on_give_up=give_up)
    if not (settings.api_keys or settings.api_keys_file) and not _is_loopback(host):
        logging.getLogger("gateway").warning(
            "no API keys (API_KEYS, API_KEYS_FILE): anyone who can reach %s:%d can use every "
            "route (docs/SECURITY.md)",
            host,
            port,
        )
    config = uvicorn_config(app, settings, host, port, log_level=settings.log_level)
    server = GatewayServer(config, app)
    server.run()
    if server.gave_up is not None:
        print(f"llm-gateway: {server.gave_up}", file=sys.stderr)
        return 1
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
