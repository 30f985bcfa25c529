"""Records and settings every stage shares: the genome, the Status enum, the experiment config, child processes."""
