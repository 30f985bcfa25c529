"""Nsight Compute over the factory's kernels, each launched as the gate would (evo.measure.launches: the plan of
make_job, one input set of the gate's fills, outputs checked against the float64 reference before and after), so
the counters belong to a kernel the gate would pass: targets.py resolves and runs them, ncu.py builds ncu's command
line and reads its CSV, runner.py profiles a targets file."""
