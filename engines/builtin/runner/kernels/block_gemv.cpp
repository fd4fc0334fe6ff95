// Short-input matmuls on block-quantised weights for x86 AVX2 + FMA + F16C (edgerun's own kernels).
//
//   y[t, n] = sum_k x[t, k] * w[n, k]        x: [T, K] float32, y: [T, N] float32, T small (decode steps)
//
// Weights, per block of 32 along k (the GGUF's own formats, the values exactly):
//   Q4_1: w = d * q + m,  q in [0, 15]; repacked at load time: codes [N, 32 * ceil(K/64)] uint8, blocks
//         in pairs, 32 bytes each, block 2i's q[j] in byte j's low nibble and block 2i+1's in its high
//         one; scales [N, 2, K/32] float16 (a row's d, then its m)
//   Q8_0: w = d * q,      q in [-128, 127]; codes [N, K] int8; scales [N, K/32] float16 (d)
//
// The activations are quantised once per call, per block of 32: x ~= s * p with s = max|x| / L, so each
// block's dot product is integer arithmetic, scaled once: sum_j w_j x_j ~= d * s * sum_j q_j p_j
// (+ m * sum_j x_j for Q4_1, with the block's exact float32 sum of x).
//   Q4_1: p int16 (L = 32767: an error of 2^-16 of the block's max |x|, far below float16's), so
//         madd_epi16 multiplies 16-bit codes by 16-bit activations; read as 16-bit lanes, a pair's 32
//         bytes give four vectors of codes with one AND or shift each (bits 0-3: block 2i's even codes,
//         4-7: block 2i+1's even, 8-11: 2i's odd, 12-15: 2i+1's odd), and the activations are stored
//         in that order, so no shuffles are needed.
//   Q8_0: p int16 too, the codes widened to int16 (two converts per block), madd_epi16 -> s32.
// Output rows n are split over torch's own thread pool (at::parallel_for, built with -fopenmp against the
// libgomp torch loads: see kernels/__init__.py): torch.set_num_threads governs them.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include "block_gemv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;
constexpr int kMaxRows = 4;  // activation rows per pass over a weight row (accumulators in registers)

// x [T, K] as integer blocks: p [T, row_len], s and sum [T, K/32] (each block's scale and exact sum)
template <typename P>
struct Blocks {
  int64_t row_len;
  std::vector<P> p;
  std::vector<float> s;
  std::vector<float> sum;
};

// where x[k] of a row goes among Q4_1's int16 activations: per pair of blocks 64 values, in the order
// block 2i even j, block 2i odd j, block 2i+1 even j, block 2i+1 odd j (see the top of the file)
inline int64_t q4_1_slot(int64_t k) {
  const int64_t b = k / kBlock, j = k % kBlock;
  return (b / 2) * 2 * kBlock + ((b % 2) * 2 + (j % 2)) * (kBlock / 2) + j / 2;
}

template <typename P, bool kQ4Order>
Blocks<P> quantize_rows(const float* x, int64_t rows, int64_t k, float levels) {
  const int64_t nb = k / kBlock;
  const int64_t row_len = kQ4Order ? (nb + 1) / 2 * 2 * kBlock : k;
  Blocks<P> out{row_len, std::vector<P>(rows * row_len, 0), std::vector<float>(rows * nb), std::vector<float>(rows * nb)};
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + t * k + b * kBlock;
      float amax = 0.f, sum = 0.f;
      for (int j = 0; j < kBlock; ++j) {
        amax = std::max(amax, std::fabs(xb[j]));
        sum += xb[j];
      }
      const float inv = amax > 0.f ? levels / amax : 0.f;
      P* row = out.p.data() + t * row_len;
      for (int j = 0; j < kBlock; ++j) {
        const int64_t at = kQ4Order ? q4_1_slot(b * kBlock + j) : b * kBlock + j;
        row[at] = static_cast<P>(std::nearbyint(xb[j] * inv));
      }
      out.s[t * nb + b] = amax / levels;
      out.sum[t * nb + b] = sum;
    }
  }
  return out;
}

inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256i load32(const void* ptr) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ptr)); }

inline __m256 load_halves(const uint16_t* ptr) {  // 8 float16 -> 8 float32
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ptr)));
}

// R activation rows t0.. of xq: where each one's values, block scales and block sums start
template <int R, typename P>
struct RowViews {
  const P* p[R];
  const float* s[R];
  const float* sum[R];

  RowViews(const Blocks<P>& xq, int64_t t0, int64_t nb) {
    for (int r = 0; r < R; ++r) {
      p[r] = xq.p.data() + (t0 + r) * xq.row_len;
      s[r] = xq.s.data() + (t0 + r) * nb;
      sum[r] = xq.sum.data() + (t0 + r) * nb;
    }
  }
};

// a kernel's weight codes and activation blocks
template <typename C, typename P>
struct BlockTypes {
  using Code = C;
  using Act = Blocks<P>;
};

// One weight row against R activation rows. The block scales d * s of 8 blocks at a time come from one
// float16 -> float32 convert and one multiply, stored so that each block broadcasts its own from memory.
template <int R>
struct Q4_1 : BlockTypes<uint8_t, int16_t> {
  static void row(const Act& xq, int64_t t0, int64_t nb, const Code* wq, const uint16_t* d16, float* y, int64_t n_out, int64_t n) {
    const uint16_t* m16 = d16 + nb;
    const __m256i low4 = _mm256_set1_epi16(0x000f);
    const RowViews<R, int16_t> x(xq, t0, nb);
    const auto &p = x.p, &s = x.s, &xsum = x.sum;
    __m256 acc[R], macc[R];
    float msum[R];
    for (int r = 0; r < R; ++r) {
      acc[r] = macc[r] = _mm256_setzero_ps();
      msum[r] = 0.f;
    }
    alignas(32) float ds[R][8];
    int64_t b = 0;
    for (; b < nb; b += 8) {
      const int64_t count = std::min<int64_t>(8, nb - b);
      if (count == 8) {
        const __m256 d = load_halves(d16 + b), m = load_halves(m16 + b);
        for (int r = 0; r < R; ++r) {
          _mm256_store_ps(ds[r], _mm256_mul_ps(d, _mm256_loadu_ps(s[r] + b)));
          macc[r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(xsum[r] + b), macc[r]);
        }
      } else {  // the last < 8 blocks
        for (int64_t i = 0; i < count; ++i) {
          const float d = _cvtsh_ss(d16[b + i]), m = _cvtsh_ss(m16[b + i]);
          for (int r = 0; r < R; ++r) {
            ds[r][i] = d * s[r][b + i];
            msum[r] += m * xsum[r][b + i];
          }
        }
        for (int64_t i = count; i < 8; ++i)
          for (int r = 0; r < R; ++r) ds[r][i] = 0.f;  // an odd last block's empty partner
      }
      for (int64_t j = 0; j < count; j += 2) {
        const __m256i raw = load32(wq + (b + j) * 16);
        const __m256i q_even0 = _mm256_and_si256(raw, low4);
        const __m256i q_even1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        const __m256i q_odd0 = _mm256_and_si256(_mm256_srli_epi16(raw, 8), low4);
        const __m256i q_odd1 = _mm256_srli_epi16(raw, 12);
        for (int r = 0; r < R; ++r) {
          const int16_t* pp = p[r] + (b + j) * kBlock;
          const __m256i dot0 = _mm256_add_epi32(_mm256_madd_epi16(q_even0, load32(pp)), _mm256_madd_epi16(q_odd0, load32(pp + 16)));
          const __m256i dot1 = _mm256_add_epi32(_mm256_madd_epi16(q_even1, load32(pp + 32)), _mm256_madd_epi16(q_odd1, load32(pp + 48)));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot0), _mm256_broadcast_ss(&ds[r][j]), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot1), _mm256_broadcast_ss(&ds[r][j + 1]), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) y[(t0 + r) * n_out + n] = hsum(acc[r]) + hsum(macc[r]) + msum[r];
  }
};

template <int R>
struct Q8_0 : BlockTypes<int8_t, int16_t> {
  static void row(const Act& xq, int64_t t0, int64_t nb, const Code* wq, const uint16_t* d16, float* y, int64_t n_out, int64_t n) {
    const RowViews<R, int16_t> x(xq, t0, nb);
    const auto &p = x.p, &s = x.s;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    alignas(32) float ds[R][8];
    for (int64_t b = 0; b < nb; b += 8) {
      const int64_t count = std::min<int64_t>(8, nb - b);
      if (count == 8) {
        const __m256 d = load_halves(d16 + b);
        for (int r = 0; r < R; ++r) _mm256_store_ps(ds[r], _mm256_mul_ps(d, _mm256_loadu_ps(s[r] + b)));
      } else {
        for (int64_t i = 0; i < count; ++i)
          for (int r = 0; r < R; ++r) ds[r][i] = _cvtsh_ss(d16[b + i]) * s[r][b + i];
      }
      for (int64_t j = 0; j < count; ++j) {
        const __m256i q = load32(wq + (b + j) * kBlock);
        const __m256i q_lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));  // codes 0-15 as int16
        const __m256i q_hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));  // 16-31
        for (int r = 0; r < R; ++r) {
          const int16_t* pp = p[r] + (b + j) * kBlock;
          const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(q_lo, load32(pp)), _mm256_madd_epi16(q_hi, load32(pp + 16)));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&ds[r][j]), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) y[(t0 + r) * n_out + n] = hsum(acc[r]);
  }
};

// every activation row against weight row n, kMaxRows rows at a time (the weight row stays in L1)
template <template <int> class Kernel>
void all_rows(const typename Kernel<1>::Act& xq, int64_t rows, int64_t nb, const typename Kernel<1>::Code* wq, const uint16_t* scales,
              float* y, int64_t n_out, int64_t n) {
  for (int64_t t0 = 0; t0 < rows; t0 += kMaxRows) {
    switch (std::min<int64_t>(kMaxRows, rows - t0)) {
      case 1: Kernel<1>::row(xq, t0, nb, wq, scales, y, n_out, n); break;
      case 2: Kernel<2>::row(xq, t0, nb, wq, scales, y, n_out, n); break;
      case 3: Kernel<3>::row(xq, t0, nb, wq, scales, y, n_out, n); break;
      default: Kernel<4>::row(xq, t0, nb, wq, scales, y, n_out, n); break;
    }
  }
}

constexpr int64_t kGrainRows = 32;  // output rows per task at least: a small matrix stays on one thread

// y [rows, n] = x @ w.T with w's row i at codes + i * row_bytes and its scales at scales + i * scales_per_row
template <template <int> class Kernel>
void block_matmul(const typename Kernel<1>::Act& xq, int64_t rows, int64_t nb, const typename Kernel<1>::Code* wq,
                  const uint16_t* scales, int64_t row_bytes, int64_t scales_per_row, int64_t n, float* y) {
  at::parallel_for(0, n, kGrainRows, [&](int64_t n0, int64_t n1) {
    for (int64_t i = n0; i < n1; ++i) all_rows<Kernel>(xq, rows, nb, wq + i * row_bytes, scales + i * scales_per_row, y, n, i);
  });
}

void check_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t row_bytes, int64_t scales_per_row, int64_t k) {
  TORCH_CHECK(codes.is_contiguous() && codes.dim() == 2 && codes.size(1) == row_bytes, "codes must be contiguous [out, ",
              row_bytes, "] for in_features ", k, ", got ", codes.sizes());
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kHalf && scales.numel() == codes.size(0) * scales_per_row,
              "scales must be contiguous float16 with ", scales_per_row, " per output row");
}

}  // namespace

namespace edgerun {

void q4_1_matmul(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint16_t* scales, int64_t n, float* y) {
  const int64_t nb = k / kBlock;
  const auto xq = quantize_rows<int16_t, true>(x, rows, k, 32767.f);
  block_matmul<Q4_1>(xq, rows, nb, codes, scales, (nb + 1) / 2 * kBlock, 2 * nb, n, y);
}

void q8_0_matmul(const float* x, int64_t rows, int64_t k, const int8_t* codes, const uint16_t* scales, int64_t n, float* y) {
  const auto xq = quantize_rows<int16_t, false>(x, rows, k, 32767.f);
  block_matmul<Q8_0>(xq, rows, k / kBlock, codes, scales, k, k / kBlock, n, y);
}

void check_q4_1_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k) {
  TORCH_CHECK(k % kBlock == 0, "in_features must be a multiple of 32, got ", k);
  TORCH_CHECK(codes.scalar_type() == at::kByte, "q4_1 codes must be uint8");
  check_weight(codes, scales, (k / kBlock + 1) / 2 * kBlock, 2 * (k / kBlock), k);
}

void check_q8_0_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k) {
  TORCH_CHECK(k % kBlock == 0, "in_features must be a multiple of 32, got ", k);
  TORCH_CHECK(codes.scalar_type() == at::kChar, "q8_0 codes must be int8");
  check_weight(codes, scales, k, k / kBlock, k);
}

}  // namespace edgerun

namespace {

at::Tensor checked_input(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x must be a 2-D float32 CPU tensor");
  TORCH_CHECK(x.size(1) % kBlock == 0, "in_features must be a multiple of 32, got ", x.size(1));
  return x.contiguous();
}

// x [rows, K] float32 -> x @ w.T [rows, N] float32, w in one block format (its weight check and matmul)
template <typename Code>
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        void (*check)(const at::Tensor&, const at::Tensor&, int64_t),
                        void (*matmul)(const float*, int64_t, int64_t, const Code*, const uint16_t*, int64_t, float*)) {
  const at::Tensor xc = checked_input(x);
  const int64_t k = xc.size(1);
  check(codes, scales, k);
  at::Tensor y = at::empty({xc.size(0), codes.size(0)}, xc.options());
  matmul(xc.data_ptr<float>(), xc.size(0), k, codes.data_ptr<Code>(), reinterpret_cast<const uint16_t*>(scales.data_ptr()),
         codes.size(0), y.data_ptr<float>());
  return y;
}

// codes [N, 32 * ceil(K / 64)] uint8: blocks paired, block 2i in the low nibbles of 32 bytes and block
// 2i + 1 in the high ones; scales [N, 2, K / 32] float16: each row's d, then its m
at::Tensor q4_1_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  return block_linear<uint8_t>(x, codes, scales, edgerun::check_q4_1_weight, edgerun::q4_1_matmul);
}

// codes [N, K] int8, scales [N, K / 32] float16
at::Tensor q8_0_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  return block_linear<int8_t>(x, codes, scales, edgerun::check_q8_0_weight, edgerun::q8_0_matmul);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(edgerun, m) {
  m.def("q4_1_linear(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("q8_0_linear(Tensor x, Tensor codes, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(edgerun, CPU, m) {
  m.impl("q4_1_linear", q4_1_linear);
  m.impl("q8_0_linear", q8_0_linear);
}
