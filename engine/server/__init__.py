"""LocalChat as an OpenAI-compatible HTTP server (`python -m engine serve MODEL`).

    protocol.py    OpenAI request bodies -> engine GenerationRequest (validation names the field)
    responses.py   engine events -> OpenAI response objects and SSE chunks
    api_errors.py  the OpenAI error shape, and engine errors -> HTTP status + that shape
    access.py      who may call: the Host a request names (DNS rebinding), the Origin (web pages)
    app.py         the Starlette application: routes, API key, JSON body (type, size, deadline),
                   CORS, disconnects
    serve.py       binding (loopback unless an API key is set), uvicorn with limits on open
                   connections and on the time a request may take to arrive, the "ready" line

Requests run through engine.batching.scheduler.BatchScheduler, which owns the forward passes.
No Qt here: the desktop app will start the same server on its loaded model.
"""
