// The block-format matmuls of block_gemv.cpp, and their weight checks, for edgerun's other kernels (decode_step.cpp).
//
//   y[t, i] = sum_k x[t, k] * w[i, k]    x: [rows, k] float32 (k a multiple of 32), y: [rows, n] float32
//
// Weights in linear.py's pack_q4_1 / pack_q8_0 layouts (block_gemv.cpp's top: output columns in groups of 8),
// any number of rows; output columns split over torch's thread pool.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace edgerun {

void q4_1_matmul(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint16_t* scales, int64_t n, float* y);
void q8_0_matmul(const float* x, int64_t rows, int64_t k, const int8_t* codes, const uint16_t* scales, int64_t n, float* y);

// that codes and scales hold a weight of in_features k in that layout (contiguous): its out_features; a
// TORCH_CHECK error naming what is wrong if not
int64_t check_q4_1_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k);
int64_t check_q8_0_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k);

}  // namespace edgerun
