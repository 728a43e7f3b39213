"""Activities: everything that does I/O (the model endpoint, PostgreSQL, SMTP) lives here."""
