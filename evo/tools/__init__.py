"""Tools over a run's outputs (dispatch tables, evaluations, kernels under Nsight Compute, repeated gates): the
functions behind `kfactory dispatch`, `evals`, `profile` and `regate`."""
