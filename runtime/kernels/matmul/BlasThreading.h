// Who threads the CPU products (docs/generation.md, "Performance"). By default OpenBLAS threads each
// GEMM itself (OPENBLAS_NUM_THREADS). Every dgemma-run command hands that to the backend's pool
// instead: OpenBLAS runs one thread, the matmul kernel splits a large product into row or column
// blocks over the pool, and moe_experts runs its experts' products side by side. OpenBLAS's own
// threads would wake and synchronise for each of a step's many products and spin between them,
// next to the pool's threads on the same cores. The blocks depend on the shape alone, so a product's
// bytes are the same for every thread count (test/unit/kernels/PooledProductsTest.cpp).
//
// Where OpenBLAS keeps its threads (a process that never calls threadProductsOnPool: the kernel
// tests, an embedding program), the MoE and attention kernels still take the choice per call
// (SingleThreadedProducts): their many small per-expert or per-tile products run side by side on the
// pool, each one single-threaded OpenBLAS call.
#pragma once

namespace dgemma {

// Sets OpenBLAS to one thread and lets the kernels thread the products on the pool, for the rest of
// the process (dgemma-run generate and eval call it before any product runs).
void threadProductsOnPool();

// Whether threadProductsOnPool() was called: the kernels may then call OpenBLAS from several pool
// threads at once.
bool productsThreadedOnPool();

// For its lifetime OpenBLAS runs one thread per call, so a kernel may call it from several pool
// threads at once; the thread count it had comes back at the end. OpenBLAS's count is one setting
// for the process: this is sound because a process runs one kernel at a time (one rank per
// process), so no other kernel's product runs meanwhile.
class SingleThreadedProducts {
 public:
  SingleThreadedProducts();
  ~SingleThreadedProducts();
  SingleThreadedProducts(const SingleThreadedProducts&) = delete;
  SingleThreadedProducts& operator=(const SingleThreadedProducts&) = delete;

 private:
  int previousThreads_;
};

}  // namespace dgemma
