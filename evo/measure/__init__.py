"""Measure: the gate, the GPU worker and its watchdog, judging into Outcomes, evaluators (GPU, replay, Ray)."""
