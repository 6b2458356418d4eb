"""Comparing tensors with a reference (weft's output, or the reference against its self-checks):
the relative error, a printed ok / FAIL line per tensor, every tensor of a dict at once, and
bit-for-bit equality."""

import math

import numpy as np


def rel_err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    if not np.all(np.isfinite(got)):
        return math.inf, diff, scale
    if scale == 0.0:
        return (0.0 if diff == 0.0 else math.inf), diff, scale
    return diff / scale, diff, scale


def compare(name, got, ref, tol, quiet=False, scale=None):
    """Prints max|diff|/max|ref| of got against ref and returns True when it is <= tol (shapes
    must match; non-finite values fail). A reference that is all zeros requires exact zeros,
    unless `scale` is given: the denominator is then max(scale, max|ref|) (for a tensor that is
    zero only by cancellation, whose round-off is measured against a related tensor's size)."""
    if got is None:
        print(f"  FAIL {name}: missing from weft's output")
        return False
    if ref is None:
        print(f"  FAIL {name}: nothing to compare against (missing from the baseline)")
        return False
    got, ref = np.asarray(got), np.asarray(ref)
    if tuple(got.shape) != tuple(ref.shape):
        print(f"  FAIL {name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
        return False
    rel, diff, ref_scale = rel_err(got, ref)
    if scale is not None and scale > ref_scale and np.all(np.isfinite(got)):
        rel, ref_scale = diff / scale, scale
    scale = ref_scale
    ok = rel <= tol
    if not ok or not quiet:
        print(f"  {'ok  ' if ok else 'FAIL'} {name:48s} max|diff|/max|ref| = {rel:.3e}  "
              f"(max|diff| {diff:.3e}, max|ref| {scale:.3e}, tol {tol:g})")
    return ok


def compare_all(prefix, got, ref, tol, scales=None):
    """Compares every ref[name] with got[prefix + name] (with compare's scale=scales[name] where
    scales has the name). Returns the failing names (missing, wrong shape, over tolerance) and
    reports names weft wrote under prefix that ref lacks."""
    bad = []
    scales = scales or {}
    for name in ref:
        if not compare(prefix + name, got.get(prefix + name), ref[name], tol,
                       scale=scales.get(name)):
            bad.append(prefix + name)
    extra = sorted(k for k in got if k.startswith(prefix) and k[len(prefix):] not in ref)
    for k in extra:
        print(f"  FAIL {k}: weft wrote it but the model has no such parameter")
        bad.append(k)
    return bad


def identical(name, got, ref):
    """Bit-for-bit equality (same shape, same float32 bits)."""
    if got is None or ref is None:
        print(f"  FAIL {name}: missing")
        return False
    a = np.array(got, dtype=np.float32, order="C")
    b = np.array(ref, dtype=np.float32, order="C")
    if a.shape != b.shape:
        print(f"  FAIL {name}: shapes {a.shape} vs {b.shape}")
        return False
    nd = int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))
    if nd:
        print(f"  FAIL {name}: {nd} of {a.size} values differ, max|diff| "
              f"{float(np.max(np.abs(a.astype(np.float64) - b))):.3e}")
        return False
    return True
