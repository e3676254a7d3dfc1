"""The router's REST doors, by resource: ``app`` makes the FastAPI app (errors, admission) of the resources'
routes — ``keys`` (a key's lookup, versions, windows and metadata; many keys), ``scans`` (keys and windows in order),
``tables``, ``cluster``, ``console`` and ``ops`` (health and metrics); ``routes`` parses a path into what it names
and answers the key routes, for the app and for the HTTP/1.1 path (:mod:`router.transports.http1`) alike."""
