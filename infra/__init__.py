"""Everything that touches the outside: the CLI (composition root), later settings and I/O."""
