"""Front-end processes (``deploy serve --frontends N``): REST and gRPC decoded and encoded in N
processes, the models in one.

One Python process decodes, validates and encodes requests on one interpreter, which capped the
server near 350 image-sized requests/s on a 16-core host whose GPU computes 7,700 images/s in
process (issue 44). With front ends, the first process holds the registry, the batchers and
the runtimes (the *model process*) and starts N front-end processes that each serve both ports
(``SO_REUSEPORT``: the kernel spreads connections over them). A front end hands every request to
the model process over a Unix socket (``wire``): tensors through shared memory it owns
(``slots``: one copy, never a pickled array), everything else as a small message; the model
process runs it on the one dataplane (``hub``), so dynamic batching merges requests from every
front end, and routing, shadows, hot reload, shared-memory regions and metrics stay in one place.
A front end that dies is restarted and the others keep serving (``supervisor``); SIGTERM drains
every front end before the models unload.
"""
