#include "runtime/kernels/matmul/BlasThreading.h"

#include <cblas.h>

#include <atomic>

namespace dgemma {
namespace {
std::atomic<bool> pooledProducts{false};
}  // namespace

void threadProductsOnPool() {
  openblas_set_num_threads(1);
  pooledProducts.store(true, std::memory_order_release);
}

bool productsThreadedOnPool() { return pooledProducts.load(std::memory_order_acquire); }

}  // namespace dgemma
