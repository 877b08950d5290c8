"""`python -m gateway_bench`: the same as `llm-gateway bench`."""

from gateway_bench import main

if __name__ == "__main__":  # vLLM's engine process is spawned: it re-imports this module
    raise SystemExit(main())
