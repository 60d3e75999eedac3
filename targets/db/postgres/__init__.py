"""The PostgreSQL target: a throwaway cluster, its knobs on this host, pgbench."""
