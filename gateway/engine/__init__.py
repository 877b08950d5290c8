"""The engine: the vLLM engine wrapper (vllm_engine.py and its parts), the bulk cap's
scheduler, beam search, CPU defaults, the default model, the holder that rebuilds a dead
engine, and engine replicas on Ray.

The only folder that imports vLLM, torch or Ray. May import: config/, protocols/.
"""

from gateway.engine.torch_extras import hide_unloadable

hide_unloadable()  # before anything here imports transformers or vLLM
