"""Measure: the gate, the GPU worker and its watchdog, verdicts, evaluators (GPU, replay, Ray)."""
