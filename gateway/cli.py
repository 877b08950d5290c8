"""`llm-gateway`: serve the gateway, or prepare the embedded default model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from gateway.config.loading import load_settings
from gateway.config.models_file import configured_models
from gateway.config.settings import ConfigError
from gateway.server import run_server
from gateway.stores.feedback import FeedbackStore, feedback_path


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
    if argv[:2] == ["container", "llm-gateway"]:  # any command, inside the container
        return main(argv[2:])
    if argv[:1] == ["container"]:  # serve, SageMaker's serve, health: gateway/container.py
        from gateway.container import main as container

        return container(argv[1:])
    if argv[:1] == ["bench"]:  # its own package, a subcommand per scenario: gateway_bench/
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
        from gateway.engine.default_model import prepare_default_model

        print(prepare_default_model())
        return 0
    try:
        settings = load_settings(dotenv_path=args.env_file)
        configured_models(settings)  # MODELS_FILE read before anything starts
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


if __name__ == "__main__":
    raise SystemExit(main())
