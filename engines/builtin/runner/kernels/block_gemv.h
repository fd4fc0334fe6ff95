// The block-format matmuls of block_gemv.cpp, and their weight checks, for edgerun's other kernels (decode_step.cpp).
//
//   y[t, i] = sum_k x[t, k] * w[i, k]    x: [rows, k] float32 (k a multiple of 32), y: [rows, n] float32
//
// Q4_1 weights in pack_q4_1's layout (codes [n, 32 * ceil(k/64)] uint8, scales [n, 2, k/32] float16), Q8_0
// ones as codes [n, k] int8 and scales [n, k/32] float16; output rows split over torch's thread pool.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace edgerun {

void q4_1_matmul(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint16_t* scales, int64_t n, float* y);
void q8_0_matmul(const float* x, int64_t rows, int64_t k, const int8_t* codes, const uint16_t* scales, int64_t n, float* y);

// that codes and scales hold a weight of in_features k in that layout (contiguous); a TORCH_CHECK error naming it if not
void check_q4_1_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k);
void check_q8_0_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k);

}  // namespace edgerun
