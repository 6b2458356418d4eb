// The CUDA backend's products and which kernel takes each: x W^T of up to 8 rows on few_rows.cu,
// of up to 64 (WEFT_CUDA_SKINNY_ROWS) on skinny.cu, the rest on cuBLASLt (matmul.c); in a
// forward-only pass the RMSNorm before a few-row product, and the SwiGLU after a gate|up
// product, in the same launch.
//
// With batch_invariant on (generation whose output must not depend on its batching, backend.h)
// every forward product goes to skinny.cu, whatever its rows: a row then has the same bits alone
// or among thousands, which the few-row kernel (another order) and cuBLASLt (whose algorithm
// changes with the rows) cannot give together; the folded norms stand aside for the same reason.
#include <stdint.h>

#include "backend/cuda/internal.h"

typedef enum product_kernel { BY_GEMM, BY_FEW_ROWS, BY_SKINNY } product_kernel;

// The kernel for x W^T of m rows (x rows ldx apart, W (N, k) rows ldw apart) into bf16.
static product_kernel kernel_for(weft_backend *self, int m, int k, const void *x, int ldx,
                                 const void *w, int ldw) {
    cuda_state *st = weft_cuda_state(self);
    if (st->batch_invariant) {
        WEFT_CHECK(k % 32 == 0, "rollout.batch_invariant=true: the model has a product over %d "
                   "columns (hidden_size, intermediate_size or heads x head_dim), and the "
                   "batch-invariant products take multiples of 32; set "
                   "rollout.batch_invariant=false", k);
        WEFT_CHECK(weft_cuda_skinny_fits(k, x, ldx, w, ldw),
                   "internal: a batch-invariant product's operands are not 16-byte aligned");
        return BY_SKINNY;
    }
    if (st->few_rows && weft_cuda_few_rows_covers(m, k, x, ldx, w, ldw)) return BY_FEW_ROWS;
    if (st->skinny && m > WEFT_CUDA_FEW_ROWS && m <= st->skinny_rows &&
        weft_cuda_skinny_fits(k, x, ldx, w, ldw))
        return BY_SKINNY;
    return BY_GEMM;
}

// An empty sum (k = 0): C = beta * C_in, and the model only ever asks for beta 0 or 1.
static void empty_sum(weft_backend *self, int m, int n, float beta, const void *c_in, void *c,
                      int ldc, weft_dtype type) {
    WEFT_CHECK(beta == 0.0f || beta == 1.0f, "internal: empty GEMM with beta %g", beta);
    size_t esz = weft_dtype_size(type), pitch = (size_t)ldc * esz;
    cudaStream_t stream = weft_cuda_op_stream(self);
    if (beta == 0.0f)
        CUDA_CHECK(cudaMemset2DAsync(c, pitch, 0, (size_t)n * esz, (size_t)m, stream));
    else if (c_in != c)
        CUDA_CHECK(cudaMemcpy2DAsync(c, pitch, c_in, pitch, (size_t)n * esz, (size_t)m,
                                     cudaMemcpyDeviceToDevice, stream));
    weft_cuda_launched(self, "matmul (empty sum)");
}

void weft_cuda_op_matmul(weft_backend *self, bool ta, bool tb, int m, int n, int k, float alpha,
                         const void *a, int lda, const void *b, int ldb, float beta,
                         const void *c_in, const void *bias, void *c, int ldc,
                         weft_matmul_types types) {
    WEFT_CHECK(types.a == WEFT_BF16 && types.b == WEFT_BF16,
               "internal: the cuda backend multiplies bf16 matrices");
    WEFT_CHECK(!bias || (types.c == WEFT_BF16 && ldc == n),
               "internal: a bias on an fp32 or strided product");
    if (m == 0 || n == 0) return;
    cuda_state *st = weft_cuda_state(self);
    if (!c_in) c_in = c;
    if (k == 0) {
        empty_sum(self, m, n, beta, c_in, c, ldc, types.c);
    } else {
        bool projection = !ta && tb && types.c == WEFT_BF16; // x W^T into bf16: a layer's forward
        product_kernel kind = projection ? kernel_for(self, m, k, a, lda, b, ldb) : BY_GEMM;
        if (kind == BY_FEW_ROWS) {
            weft_cuda_few_rows(weft_cuda_op_queue(self), m, n, k, alpha, a, lda, b, ldb, beta,
                               c_in, bias, c, ldc);
            weft_cuda_launched(self, "matmul (few rows)");
            return; // the bias added in the same launch
        }
        if (kind == BY_SKINNY) {
            float *partials = weft_cuda_scratch(self, weft_cuda_skinny_partials_bytes(m, n, k));
            weft_cuda_skinny(weft_cuda_op_queue(self), m, n, k, alpha, a, lda, b, ldb, beta, c_in,
                             bias, c, ldc, partials, st->arrived);
            weft_cuda_launched(self, "matmul (skinny)");
            return; // the bias added in the same launch
        }
        bool split = weft_cuda_gemm(st->gemms, weft_cuda_op_stream(self), ta, tb, m, n, k, alpha,
                                    a, lda, b, ldb, beta, c_in, c, ldc, types);
        weft_cuda_launched(self, types.c == WEFT_F32 ? "matmul (fp32 out: dW)"
                                 : split             ? "matmul (split K)"
                                                     : "matmul");
    }
    if (bias) { // rounded as the product was stored: a separate add's bits, whichever path ran
        weft_cuda_bias_forward(weft_cuda_op_queue(self), c, bias, m, n);
        weft_cuda_launched(self, "bias_add");
    }
}

// Up to 64 rows (a decode step), or any with batch_invariant: the product and the activation in
// one launch (few_rows.cu, skinny.cu); else both ops.
void weft_cuda_op_swiglu_product(weft_backend *self, const void *x, const void *w, void *gate_up,
                                 void *out, int rows, int C, int width) {
    cuda_state *st = weft_cuda_state(self);
    product_kernel kind = kernel_for(self, rows, C, x, C, w, C);
    if (kind == BY_FEW_ROWS) {
        weft_cuda_few_rows_swiglu(weft_cuda_op_queue(self), rows, width, C, x, C, w, C, out,
                                  width);
        weft_cuda_launched(self, "swiglu_product (few rows)");
    } else if (kind == BY_SKINNY) {
        float *partials =
            weft_cuda_scratch(self, weft_cuda_skinny_partials_bytes(rows, 2 * width, C));
        weft_cuda_skinny_swiglu(weft_cuda_op_queue(self), rows, width, C, x, C, w, C, out, width,
                                partials, st->arrived);
        weft_cuda_launched(self, "swiglu_product (skinny)");
    } else {
        weft_matmul_types types = {WEFT_BF16, WEFT_BF16, WEFT_BF16};
        weft_cuda_op_matmul(self, false, true, rows, 2 * width, C, 1.0f, x, C, w, C, 0.0f, NULL,
                            NULL, gate_up, 2 * width, types);
        weft_cuda_swiglu_forward(weft_cuda_op_queue(self), gate_up, out, rows, width);
        weft_cuda_launched(self, "swiglu_forward");
    }
}

// Whether np's rows are few enough for few_rows.cu to fold its norm into the product: one
// launch fewer at a decode step. WEFT_CUDA_FOLD_NORM=0 keeps them apart, to time one against the
// other; batch_invariant too, as its products are skinny.cu's.
static bool folds_norm(weft_backend *self, const weft_norm_product *np) {
    cuda_state *st = weft_cuda_state(self);
    return !st->batch_invariant && st->few_rows && st->fold_norm &&
           (uintptr_t)np->norm_w % 16 == 0 &&
           weft_cuda_few_rows_covers(np->rows, np->C, np->x, np->C, np->w, np->C);
}

bool weft_cuda_op_norm_product(weft_backend *self, const weft_norm_product *np, void *y, int N,
                               bool swiglu) {
    if (!folds_norm(self, np)) return false;
    weft_cuda_few_rows_normed(weft_cuda_op_queue(self), np->rows, N, np->C, np->x, np->norm_w,
                              np->eps, np->w, np->bias, y, swiglu);
    weft_cuda_launched(self, swiglu ? "swiglu_product (few rows, normed)"
                                    : "matmul (few rows, normed)");
    return true;
}

// Where q and k turn (rotate's heads are the q heads then the k heads) and every part is whole
// heads, the q|k|v product stores its rows itself too (few_rows.cu); fused is left unwritten.
bool weft_cuda_op_norm_product_store(weft_backend *self, const weft_norm_product *np,
                                     void *fused, const weft_column_parts *parts,
                                     const weft_rope_rows *r, const weft_kv_pool *pool, int layer,
                                     const int32_t *slot) {
    int D = r->head_dim, qd = parts->width[0], kvd = pool->width;
    bool heads = parts->n == 3 && parts->width[1] == kvd && parts->width[2] == kvd &&
                 D % 2 == 0 && qd % D == 0 && kvd % D == 0 && r->heads * D == qd + kvd;
    if (!heads || !folds_norm(self, np)) return false;
    (void)fused;
    weft_cuda_few_rows_normed_store(weft_cuda_op_queue(self), np->rows, np->C, np->x, np->norm_w,
                                    np->eps, np->w, np->bias, parts->part[0], qd, kvd,
                                    r->positions, r->inv_freq, r->scale, r->heads, D, pool->data,
                                    pool->layers, pool->block_size, layer, slot);
    weft_cuda_launched(self, "matmul (few rows, normed, stored)");
    return true;
}

void weft_cuda_op_batch_invariant(weft_backend *self, bool on) {
    cuda_state *st = weft_cuda_state(self);
    int cc = weft_cuda_compute_capability(st->device);
    WEFT_CHECK(!on || cc >= 80, "rollout.batch_invariant=true: GPU %d has compute capability "
               "%d.%d, and the batch-invariant products run on the tensor cores of 8.0 and newer "
               "(A100, H100); set rollout.batch_invariant=false", st->device, cc / 10, cc % 10);
    st->batch_invariant = on;
}
