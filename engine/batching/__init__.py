"""Batched serving on one loaded model: requests decoded together, admitted against a KV budget.

    scheduler.py     BatchScheduler (submit -> Ticket, stats, close): driver thread per request,
                     one scheduler thread running one batched forward per step
    forward_work.py  a request's pending forward call, and how a step is cut from them
    admission.py     KV byte budget, concurrency slots, bounded FIFO queue

No Qt, no HTTP: the server (`python -m engine serve`) and the app sit on top of it.
"""

from engine.batching.scheduler import BatchScheduler, Ticket

__all__ = ["BatchScheduler", "Ticket"]
