"""Kernel Factory's engine: config, genomes, render, build, run, search, CLI."""
