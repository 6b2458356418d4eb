#pragma once
#include "core/core.h"
// Re-executes the process with OPENBLAS_CORETYPE set when OpenBLAS misdetects this CPU. Call first
// thing in main(), before any threads exist. Returns normally when nothing needed fixing.
void weft_blas_fix_coretype(void);
const char *weft_blas_corename(void);
// Whether a product's rows keep their bits without padding small calls (ops.c): true of the
// Sandybridge kernels, which have no small-matrix path; false where OpenBLAS may take one.
bool weft_blas_rows_stable_unpadded(void);
