"""I/O with PostgreSQL: replication connections on ``psycopg.pq`` (libpq does auth,
TLS and COPY BOTH), driven synchronously or under asyncio by one set of generators."""
