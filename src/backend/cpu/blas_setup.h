#pragma once
#include "core/core.h"
// Re-executes the process with OPENBLAS_CORETYPE set when OpenBLAS misdetects this CPU. Call first
// thing in main(), before any threads exist. Returns normally when nothing needed fixing.
void weft_blas_fix_coretype(void);
const char *weft_blas_corename(void);
