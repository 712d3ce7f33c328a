"""Text side of the engine: tokenizer loading, chat templates and (later) detokenization.

Used by the engine frontend and entrypoints only; never by core or worker.
"""
