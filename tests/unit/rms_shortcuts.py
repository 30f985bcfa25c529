"""RMSNorm in float32 numpy, honest and with one part of the formula dropped: the shortcuts a
kernel could take. Used to prove the gate's input kinds and tolerances (test_gate_kinds) and, as
fake kernels, the gate itself (test_gate)."""

from __future__ import annotations

import numpy as np


def honest(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True, dtype=np.float32) + eps) * w


def no_eps(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True)) * w


def no_reduction(x, w, eps):
    return x * w


def constant_rms(x, w, eps):
    return x / np.sqrt(np.float32(1.0) + eps) * w


def quarter_reduction(x, w, eps):
    q = x[:, : max(1, x.shape[1] // 4)]
    return x / np.sqrt(np.mean(q * q, axis=1, keepdims=True) + eps) * w


def strided_reduction(x, w, eps):
    q = x[:, ::8]
    return x / np.sqrt(np.mean(q * q, axis=1, keepdims=True) + eps) * w


def no_weight(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)


def centred(x, w, eps):
    c = x - x.mean(axis=1, keepdims=True)
    return c / np.sqrt(np.mean(c * c, axis=1, keepdims=True) + eps) * w


def clamped_instead_of_eps(x, w, eps):
    return x / np.sqrt(np.maximum(np.mean(x * x, axis=1, keepdims=True), np.float32(1e-12))) * w


def fp16_accumulation(x, w, eps):
    with np.errstate(over="ignore"):
        ss = np.sum((x * x).astype(np.float16), axis=1, keepdims=True, dtype=np.float16).astype(np.float32)
    return x / np.sqrt(ss / x.shape[1] + eps) * w


SHORTCUTS = [no_eps, no_reduction, constant_rms, quarter_reduction, strided_reduction, no_weight, centred,
             clamped_instead_of_eps, fp16_accumulation]
