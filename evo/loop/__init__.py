"""The loop: a run's session, propose -> screen -> build -> measure -> record -> learn."""
