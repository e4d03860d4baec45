"""LocalChat as an OpenAI-compatible HTTP server (`python -m engine serve MODEL`).

    protocol.py    OpenAI request bodies -> engine GenerationRequest (validation names the field)
    responses.py   engine events -> OpenAI response objects and SSE chunks
    api_errors.py  the OpenAI error shape, and engine errors -> HTTP status + that shape
    app.py         the Starlette application: routes, API key, body limit, CORS, disconnects
    serve.py       binding (loopback unless an API key is set), uvicorn, the "ready" line

Requests run through engine.batching.scheduler.BatchScheduler, which owns the forward passes.
No Qt here: the desktop app will start the same server on its loaded model.
"""
