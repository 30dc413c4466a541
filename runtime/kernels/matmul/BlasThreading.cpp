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

SingleThreadedProducts::SingleThreadedProducts() : previousThreads_(openblas_get_num_threads()) {
  if (previousThreads_ != 1) openblas_set_num_threads(1);
}

SingleThreadedProducts::~SingleThreadedProducts() {
  if (previousThreads_ != 1) openblas_set_num_threads(previousThreads_);
}

}  // namespace dgemma
