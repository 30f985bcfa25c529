"""Templates: the TOML header (space, constraints, launch plan), the Jinja sandbox, rendering."""
