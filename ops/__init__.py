"""Operators: one folder per op with its spec, float64 reference, input kinds and device hooks (the engine's
vocabulary, OpSpec and its parts, is evo.core.spec; the registry that finds the op folders is evo.core.registry).
"""
