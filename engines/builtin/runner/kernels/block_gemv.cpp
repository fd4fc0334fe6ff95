// Matmuls on block-quantised weights for x86 AVX2 + FMA + F16C (edgerun's own kernels), for any number of rows.
//
//   y[t, n] = sum_k x[t, k] * w[n, k]        x: [T, K] float32, y: [T, N] float32
//
// Weights, per block of 32 along k (the GGUF's own formats, the values exactly):
//   Q4_1: w = d * q + m,  q in [0, 15]
//   Q8_0: w = d * q,      q in [-128, 127]
// The activations are quantised once per call, per row and block of 32: x ~= s * p with p int16 and
// s = max|x| / 32767 (an error of 2^-16 of the block's max |x|, far below float16's), so each block's
// contribution is an integer dot product scaled once: sum_j w_j x_j ~= d * s * sum_j q_j p_j (+ m * sum_j x_j
// for Q4_1, with the block's exact float32 sum of x).
//
// The products are an outer product: output columns in groups of 8, one 256-bit vector holds a group's codes
// for two consecutive k as 16 int16 lanes (lane 2c + e: column c, k + e), and madd_epi16 against the pair
// (p[k], p[k + 1]) broadcast to every lane gives each column's two products summed in one int32 lane: 16
// multiply-adds per instruction, twice FMA's 8 (float16 GEMM's arithmetic), and AVX2 CPUs issue two a cycle.
// A tile of up to 4 rows x 2 groups keeps its int32 sums in registers over a block, then scales them into
// float32 once per block; a tile's weights (16 columns x K) stay in L1 while every row passes over them, so
// a weight is read from memory once per call at any row count.
//
// Layouts (linear.py's pack_q4_1 / pack_q8_0 write them at load time; G = ceil(N / 8) groups, the last one
// padded with zero codes):
//   Q4_1 codes [G, K/32 * 128] uint8: per group and block four 32-byte quads; read as 16 uint16 lanes, quad u's
//        lane 2c + e holds in its nibble s (bits 4s..4s+3) the code of column c at k = 8u + 2s + e, so one AND
//        or shift per 16 lanes unpacks the codes of a k pair; scales [K/32, 2, N] float16 (each block's d of
//        every column, then its m)
//   Q8_0 codes [G, K/32 * 256] int8: per group, block and k pair j 16 bytes (byte 2c + e: column c, k = 2j + e),
//        widened with one convert; scales [K/32, N] float16
// Output columns are split over torch's own thread pool (at::parallel_for, built with -fopenmp against the
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
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = 8;  // output columns per vector
constexpr int kTileRows = 4;   // activation rows per pass over a tile's weights (int32 sums in registers)
constexpr int kTileGroups = 2;

// x [T, K] as int16 blocks: p [T, K], s and sum [T, K/32] (each block's scale and exact sum)
struct Blocks {
  std::vector<int16_t> p;
  std::vector<float> s;
  std::vector<float> sum;
};

Blocks quantize_rows(const float* x, int64_t rows, int64_t k) {
  constexpr float kLevels = 32767.f;
  const int64_t nb = k / kBlock;
  Blocks out{std::vector<int16_t>(rows * k), std::vector<float>(rows * nb), std::vector<float>(rows * nb)};
  const __m256 sign = _mm256_set1_ps(-0.f);
  at::parallel_for(0, rows * nb, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xb = x + i * kBlock;
      __m256 v[4], amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm256_loadu_ps(xb + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        sum = _mm256_add_ps(sum, v[j]);
      }
      alignas(32) float lanes[8], sums[8];
      _mm256_store_ps(lanes, amax);
      _mm256_store_ps(sums, sum);
      const float top = *std::max_element(lanes, lanes + 8);
      const __m256 inv = _mm256_set1_ps(top > 0.f ? kLevels / top : 0.f);
      __m256i q[4];
      for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));  // round to nearest even
      // packs works per 128-bit lane: (0, 1) -> 0-3 8-11 4-7 12-15 in 64-bit quarters; permute4x64 puts them in order
      const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8);
      const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.p.data() + i * kBlock), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.p.data() + i * kBlock + 16), hi);
      out.s[i] = top / kLevels;
      out.sum[i] = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
    }
  });
  return out;
}

inline __m256i load32(const void* ptr) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ptr)); }

// 8 float16 of columns n0 .. n0 + 7 -> float32, zeros past column n
inline __m256 load_halves(const uint16_t* ptr, int64_t n0, int64_t n) {
  if (n0 + kGroup <= n) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ptr + n0)));
  uint16_t tail[kGroup] = {};
  std::memcpy(tail, ptr + n0, (n - n0) * sizeof(uint16_t));
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tail)));
}

// Row r's sums, pinned in registers before the next row's pair is loaded: without this the compiler hoists
// every row's loads and products ahead of the adds, and the partial results outnumber the 16 vector
// registers and spill to the stack every step
template <int C>
inline void pin(__m256i (&acc)[C]) {
  for (int c = 0; c < C; ++c) __asm__("" : "+x"(acc[c]));
}

// The two formats: a group's int16 codes per k pair, and each block's float32 scaling of the int32 sums.
struct Q4_1 {
  using Code = uint8_t;
  static constexpr int64_t kGroupBlockBytes = 128;  // per group and block
  static constexpr bool kHasMin = true;
  static int64_t scales_stride(int64_t n) { return 2 * n; }  // per block

  // the int32 sums += codes of groups g[c] at block b times rows p[r]'s pairs (each p[r] at the block's start)
  template <int R, int C>
  __attribute__((always_inline)) static void block(const Code* const* g, const int16_t* const* p, __m256i (&acc)[R][C]) {
    const __m256i low4 = _mm256_set1_epi16(0x000f);
    for (int u = 0; u < 4; ++u) {
      __m256i raw[C];
      for (int c = 0; c < C; ++c) raw[c] = load32(g[c] + u * 32);
      for (int s = 0; s < 4; ++s) {
        __m256i w[C];
        for (int c = 0; c < C; ++c)
          w[c] = s == 0 ? _mm256_and_si256(raw[c], low4)
                 : s == 3 ? _mm256_srli_epi16(raw[c], 12)
                          : _mm256_and_si256(_mm256_srli_epi16(raw[c], 4 * s), low4);
        for (int r = 0; r < R; ++r) {
          int32_t pair;
          std::memcpy(&pair, p[r] + 8 * u + 2 * s, sizeof(pair));
          const __m256i x = _mm256_set1_epi32(pair);
          for (int c = 0; c < C; ++c) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(w[c], x));
          pin(acc[r]);
        }
      }
    }
  }

};

struct Q8_0 {
  using Code = int8_t;
  static constexpr int64_t kGroupBlockBytes = 256;
  static constexpr bool kHasMin = false;
  static int64_t scales_stride(int64_t n) { return n; }

  template <int R, int C>
  __attribute__((always_inline)) static void block(const Code* const* g, const int16_t* const* p, __m256i (&acc)[R][C]) {
    for (int j = 0; j < kBlock / 2; ++j) {
      __m256i w[C];
      for (int c = 0; c < C; ++c)
        w[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g[c] + j * 16)));
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, p[r] + 2 * j, sizeof(pair));
        const __m256i x = _mm256_set1_epi32(pair);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(w[c], x));
        pin(acc[r]);
      }
    }
  }

};


struct Problem {
  const Blocks& xq;
  int64_t rows, k, nb, n;
  const void* codes;
  const uint16_t* scales;
  float* y;
};

// rows t0 .. t0 + R - 1 against groups g0 .. g0 + C - 1: y's tile, scaled block by block
template <class F, int R, int C>
void tile(const Problem& pr, int64_t t0, int64_t g0) {
  using Code = typename F::Code;
  const Code* codes = static_cast<const Code*>(pr.codes);
  const int64_t group_bytes = pr.nb * F::kGroupBlockBytes, stride = F::scales_stride(pr.n);
  __m256 out[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < pr.nb; ++b) {
    const Code* g[C];
    for (int c = 0; c < C; ++c) g[c] = codes + (g0 + c) * group_bytes + b * F::kGroupBlockBytes;
    const int16_t* p[R];
    for (int r = 0; r < R; ++r) p[r] = pr.xq.p.data() + (t0 + r) * pr.k + b * kBlock;
    __m256i acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_si256();
    F::template block<R, C>(g, p, acc);
    const uint16_t* sb = pr.scales + b * stride;
    for (int c = 0; c < C; ++c) {
      const __m256 d = load_halves(sb, (g0 + c) * kGroup, pr.n);
      const __m256 m = F::kHasMin ? load_halves(sb + pr.n, (g0 + c) * kGroup, pr.n) : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r) {
        const int64_t at = (t0 + r) * pr.nb + b;
        out[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][c]), _mm256_mul_ps(d, _mm256_set1_ps(pr.xq.s[at])), out[r][c]);
        if (F::kHasMin) out[r][c] = _mm256_fmadd_ps(m, _mm256_set1_ps(pr.xq.sum[at]), out[r][c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    const int64_t n0 = (g0 + c) * kGroup, width = std::min<int64_t>(kGroup, pr.n - n0);
    for (int r = 0; r < R; ++r) {
      float* dst = pr.y + (t0 + r) * pr.n + n0;
      if (width == kGroup) {
        _mm256_storeu_ps(dst, out[r][c]);
      } else {  // the last group's real columns
        alignas(32) float tail[kGroup];
        _mm256_store_ps(tail, out[r][c]);
        std::copy_n(tail, width, dst);
      }
    }
  }
}

// every row against groups g0 .. g0 + C - 1, kTileRows rows at a time (the groups' codes stay in L1). Tried and
// dropped: a panel of the codes unpacked once to int16 for all rows, freeing registers for 5-row tiles; on
// this AMD EPYC (Zen 3) it ran 1.3-1.4x slower at 8-64 rows than unpacking in registers for every tile
template <class F, int C>
void all_rows(const Problem& pr, int64_t g0) {
  for (int64_t t0 = 0; t0 < pr.rows; t0 += kTileRows) {
    switch (std::min<int64_t>(kTileRows, pr.rows - t0)) {
      case 1: tile<F, 1, C>(pr, t0, g0); break;
      case 2: tile<F, 2, C>(pr, t0, g0); break;
      case 3: tile<F, 3, C>(pr, t0, g0); break;
      default: tile<F, kTileRows, C>(pr, t0, g0); break;
    }
  }
}

constexpr int64_t kGrainGroups = 4;  // column groups per task at least: a small matrix stays on one thread

template <class F>
void block_matmul(const float* x, int64_t rows, int64_t k, const typename F::Code* codes, const uint16_t* scales, int64_t n, float* y) {
  const Blocks xq = quantize_rows(x, rows, k);
  const Problem pr{xq, rows, k, k / kBlock, n, codes, scales, y};
  const int64_t groups = (n + kGroup - 1) / kGroup;
  at::parallel_for(0, groups, kGrainGroups, [&](int64_t begin, int64_t end) {
    int64_t g = begin;
    for (; g + kTileGroups <= end; g += kTileGroups) all_rows<F, kTileGroups>(pr, g);
    for (; g < end; ++g) all_rows<F, 1>(pr, g);
  });
}

void check_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t group_block_bytes, int64_t scales_per_block, int64_t k) {
  TORCH_CHECK(k % kBlock == 0, "in_features must be a multiple of 32, got ", k);
  const int64_t nb = k / kBlock;
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kHalf && scales.dim() == 2 && scales.size(0) == nb &&
                  scales.size(1) % scales_per_block == 0,
              "scales must be contiguous float16 [", nb, ", ", scales_per_block, " * out_features], got ", scales.sizes());
  const int64_t n = scales.size(1) / scales_per_block;
  TORCH_CHECK(codes.is_contiguous() && codes.dim() == 2 && codes.size(0) == (n + kGroup - 1) / kGroup &&
                  codes.size(1) == nb * group_block_bytes,
              "codes must be contiguous [ceil(out / 8), ", nb * group_block_bytes, "] for in_features ", k, ", got ", codes.sizes());
}

}  // namespace

namespace edgerun {

void q4_1_matmul(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint16_t* scales, int64_t n, float* y) {
  block_matmul<Q4_1>(x, rows, k, codes, scales, n, y);
}

void q8_0_matmul(const float* x, int64_t rows, int64_t k, const int8_t* codes, const uint16_t* scales, int64_t n, float* y) {
  block_matmul<Q8_0>(x, rows, k, codes, scales, n, y);
}

int64_t check_q4_1_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k) {
  TORCH_CHECK(codes.scalar_type() == at::kByte, "q4_1 codes must be uint8");
  check_weight(codes, scales, Q4_1::kGroupBlockBytes, 2, k);
  return scales.size(1) / 2;
}

int64_t check_q8_0_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k) {
  TORCH_CHECK(codes.scalar_type() == at::kChar, "q8_0 codes must be int8");
  check_weight(codes, scales, Q8_0::kGroupBlockBytes, 1, k);
  return scales.size(1);
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
                        int64_t (*check)(const at::Tensor&, const at::Tensor&, int64_t),
                        void (*matmul)(const float*, int64_t, int64_t, const Code*, const uint16_t*, int64_t, float*)) {
  const at::Tensor xc = checked_input(x);
  const int64_t k = xc.size(1), n = check(codes, scales, k);
  at::Tensor y = at::empty({xc.size(0), n}, xc.options());
  matmul(xc.data_ptr<float>(), xc.size(0), k, codes.data_ptr<Code>(), reinterpret_cast<const uint16_t*>(scales.data_ptr()), n,
         y.data_ptr<float>());
  return y;
}

// codes and scales in pack_q4_1's layout (the top of this file)
at::Tensor q4_1_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  return block_linear<uint8_t>(x, codes, scales, edgerun::check_q4_1_weight, edgerun::q4_1_matmul);
}

// codes and scales in pack_q8_0's layout
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
