"""An OpenAI-compatible HTTP server on the embedded engine (``spec-backend serve MODEL``).

``loop.AsyncEngine`` runs the engine on one thread and lets asyncio handlers join its running batch
(continuous batching); ``app.build_app`` serves ``/v1/completions``, ``/v1/chat/completions`` (streaming
and not), ``/v1/models``, ``/health`` and ``/metrics`` with FastAPI. Needs the ``serve`` extra.
"""
