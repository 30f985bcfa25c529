"""Search: parameter spaces, pure mutation operators, strategies (GA through DEAP, random)."""
