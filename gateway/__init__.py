"""The LLM serving gateway: I/O around one vLLM engine."""
