// Who threads the CPU products (docs/generation.md, "Performance"). By default OpenBLAS threads each
// GEMM itself (OPENBLAS_NUM_THREADS). Generation hands that to the backend's pool instead: OpenBLAS
// runs one thread, the matmul kernel splits a large product into row or column blocks over the pool,
// and moe_experts runs its experts' products side by side. OpenBLAS's own threads would wake and
// synchronise for each of a pass's small products and spin between them, next to the pool's threads
// on the same cores. Each element of a product is the same single-threaded OpenBLAS sum either way,
// so the results do not change (test/unit/kernels/pooled_products_test.cpp).
#pragma once

namespace dgemma {

// Sets OpenBLAS to one thread and lets the kernels thread the products on the pool, for the rest of
// the process (dgemma-run generate and eval call it before any product runs).
void threadProductsOnPool();

// Whether threadProductsOnPool() was called: the kernels may then call OpenBLAS from several pool
// threads at once.
bool productsThreadedOnPool();

}  // namespace dgemma
