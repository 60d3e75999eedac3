"""Database targets: embedded SQLite and a private PostgreSQL cluster."""
